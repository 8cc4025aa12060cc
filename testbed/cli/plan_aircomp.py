"""``testbed plan CONFIG --scheme aircomp``: the energy-minimising amplitude and noise shares
of over-the-air aggregation (:mod:`aggregator.solver.aircomp_plan`), from the run's own
settings (the noise multiplier the run calibrates, its clip, batch and data), printed beside
what the run does without a plan (every device's share at full power), and written with
``--out`` for ``testbed run --plan``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from radio.units import db_to_ratio
from testbed.core.config.experiment import ExperimentConfig


def plan_aircomp_command(args: argparse.Namespace, cfg: ExperimentConfig) -> int:
    """Plan, print (or ``--json``), and write ``--out``; exit status 0, or 3 when infeasible."""
    from aggregator.solver.aircomp_plan import AirCompInfeasible, plan_aircomp
    from radio.aircomp_air import PROBE_SYMBOLS
    from radio.analog import n_symbols_for
    from testbed.cli.model_size import count_params
    from testbed.core.config.aircomp_checks import aircomp_colluding
    from testbed.core.config.aircomp_plan_file import (
        AirCompDevicePlan,
        AirCompPlanFile,
        save_aircomp_plan,
    )
    from testbed.core.config.errors import ConfigError
    from testbed.core.config.loader import load_hardware
    from testbed.core.record_schemes import record_norm_bound
    from testbed.core.run_setup import device_settings, prepare_data
    from testbed.core.schemes import expected_power_bound

    if cfg.scheme != "aircomp":
        raise ConfigError(f"config key 'scheme': got {cfg.scheme!r}; --scheme aircomp plans an "
                          "aircomp config (set scheme=aircomp)")
    if cfg.aircomp_plan is not None:
        raise ConfigError("config key 'aircomp_plan': set; plan from a config without one")
    eta = float(args.receiver_noise_margin)
    hw = load_hardware(cfg.hw_config, args.hw_overrides)
    _data, parts = prepare_data(cfg)
    d = count_params(cfg)
    uplinks, records = device_settings(cfg, hw, d, [len(p) for p in parts])
    recs = [r for r in records if r is not None]
    z_var = max((r.target_noise_multiplier * r.example_clip / r.expected_batch) ** 2
                for r in recs)
    norm = record_norm_bound(recs[0].example_clip, recs[0].expected_batch)
    n0s = [db_to_ratio(-s) for s in cfg.snr_db_per_device()]
    n0 = min(n0s)
    gains = [math.sqrt(n0 / v) for v in n0s]
    p_max = [cfg.power.p_max_w / hw.tx_power_ref_w] * cfg.devices
    n_slot = n_symbols_for(d) + PROBE_SYMBOLS
    joules = n_slot / hw.symbol_rate_hz * hw.tx_power_ref_w
    tau = uplinks[0].trusted

    def signal_power(sigma: float) -> float:
        return expected_power_bound(d=d, l=d, levels=None, alpha=1.0, clip=norm, sigma=sigma,
                                    mechanism="before")

    try:
        plan = plan_aircomp(gains=gains, n0=n0, p_max=p_max, z_var=z_var,
                            colluding=aircomp_colluding(cfg), tau=tau, eta=eta,
                            signal_power=signal_power, joules_per_unit_power=joules)
    except AirCompInfeasible as exc:
        print(f"testbed plan: error: {exc}")
        return 3
    file = AirCompPlanFile(
        devices=cfg.devices, rounds=cfg.rounds, epsilon_target=cfg.privacy.epsilon,
        delta=cfg.privacy.delta, d=d, amplitude=plan.amplitude,
        amplitude_ratio=min(1.0, plan.amplitude / plan.reach), sigma=plan.sigma,
        full_power_sigma=math.sqrt(plan.shares_var), receiver_noise_var=plan.receiver_noise_var,
        receiver_noise_margin=eta, trusted=tau, energy_round_j=plan.energy_per_round_j,
        full_power_energy_round_j=plan.full_power_energy_round_j,
        energy_j=plan.energy_per_round_j * cfg.rounds, notes=plan.notes,
        devices_plan=[AirCompDevicePlan(
            id=j, h=gains[j], alpha=plan.alpha[j],
            power_w=plan.power[j] * hw.tx_power_ref_w, e_comm_j_round=plan.energy_round_j[j])
            for j in plan.participants],
    )
    if args.out is not None:
        save_aircomp_plan(file, args.out)
    if args.json:
        out: dict[str, Any] = file.model_dump(mode="json")
        if args.out is not None:
            out["plan_file"] = str(args.out)
        print(json.dumps(out))
        return 0
    print("== aircomp (one slot per round, every device's share of the noise)")
    print(f"  c = {plan.amplitude:.4g} ({file.amplitude_ratio:.3g} of the largest every device "
          f"reaches), receiver noise {plan.receiver_noise_var:.4g} per coordinate of the sum "
          f"(trusted {tau:g}, margin {eta:g})")
    print(f"  share sigma = {plan.sigma:.4g} (at full power, no receiver credit: "
          f"{file.full_power_sigma:.4g})")
    print(f"  radio energy per round {plan.energy_per_round_j:.4g} J, over {cfg.rounds} rounds "
          f"{file.energy_j:.4g} J; at full power {plan.full_power_energy_round_j:.4g} J per "
          f"round ({plan.energy_per_round_j / plan.full_power_energy_round_j:.3g}x)")
    print("  dev       |h|      alpha   power_W  E_comm_J/rd")
    for dev in file.devices_plan:
        print(f"  {dev.id:>3} {dev.h:9.4g} {dev.alpha:10.4g} {dev.power_w:9.4g} "
              f"{dev.e_comm_j_round:12.4g}")
    for note in plan.notes:
        print(f"  note: {note}")
    if args.out is not None:
        print(f"plan written to {args.out}")
    return 0
