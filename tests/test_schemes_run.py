"""DP schemes at the device level (`privacy.unit=device`) through `testbed run`: ledger, budget
enforcement, power limits, resume. The record level is tested in test_record_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import PEER_SCHEMES, SCHEMES
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.privacy import Ledger, rebuild_accountant
from testbed.core.runs.rundir import RunDir
from testbed.core.schemes import expected_power_bound, resolve_uplinks
from testbed.runner import resume_experiment, run_experiment

# 003's schemes (the peer systems and aircomp run only at the record unit: tests/test_peer_*.py,
# tests/test_aircomp_run.py)
DP_SCHEMES = [s for s in SCHEMES if s not in ("fedavg", "aircomp") and s not in PEER_SCHEMES]


@pytest.mark.parametrize("scheme", DP_SCHEMES)
@pytest.mark.parametrize("accounting", ["paper", "strict"])
def test_each_dp_scheme_runs_and_stays_within_target(
    tmp_path: Path, tiny_overrides: list[str], scheme: str, accounting: str
) -> None:
    cfg = load_experiment(
        None,
        [
            *tiny_overrides,
            "privacy.unit=device",
            f"scheme={scheme}",
            f"privacy.accounting={accounting}",
            "privacy.epsilon=3",
            "snr_db=10",
            "fading=rayleigh",
            "compression.theta_s=0.25",
            "compression.levels=4",
        ],
    )
    summary = run_experiment(cfg, tmp_path / "run")
    devices = summary["privacy"]["devices"]
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == sum(d["uploads"] for d in devices) > 0
    for dev in devices:
        assert dev[f"epsilon_{accounting}"] <= 3.0 + 1e-9
        assert dev["noise_variance"] == pytest.approx(dev["sigma"] ** 2)
    # The summary's epsilons are recomputed independently from the ledger on disk.
    for mode in ("paper", "strict"):
        acc = rebuild_accountant(tmp_path / "run" / "ledger.jsonl", mode=mode, delta=1e-5)
        for dev in devices:
            assert acc.epsilon(dev["device"]).epsilon == pytest.approx(dev[f"epsilon_{mode}"])
    # Scheme semantics are visible in the events.
    ev = events[0]
    assert ev.mechanism == ("after" if scheme == "noise-after-compression" else "before")
    if scheme in ("ldp-fedavg", "s-dp-fl"):
        assert ev.trusted_channel_noise == 0.0
    else:
        assert ev.trusted_channel_noise == 1.0 and ev.n0 > 0
    if scheme in ("ldp-fedavg", "channel-dp"):
        assert ev.l == ev.d and ev.q is None
    else:
        assert ev.l < ev.d


def test_budget_exhaustion_stops_devices_and_the_run(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    # Enough noise for about two uploads: the guard must stop every device before the target.
    probe = load_experiment(
        None,
        [
            *tiny_overrides,
            "privacy.unit=device",
            "scheme=ldp-fedavg",
            "privacy.epsilon=2",
            "rounds=2",
        ],
    )
    sigma = resolve_uplinks(probe, load_hardware("sim"), 7850)[0].sigma
    cfg = load_experiment(
        None,
        [
            *tiny_overrides,
            "privacy.unit=device",
            "scheme=ldp-fedavg",
            "privacy.epsilon=2",
            "rounds=10",
            f"privacy.sigma={sigma * 1.0001}",
            "power.alpha=0.001",
        ],
    )
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "budget_exhausted"
    assert summary["rounds_completed"] == 2
    for dev in summary["privacy"]["devices"]:
        assert dev["uploads"] == 2 and dev["epsilon_strict"] <= 2.0


def test_alpha_beyond_power_limit_is_refused_before_any_work(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(
        None,
        [
            *tiny_overrides,
            "privacy.unit=device",
            "scheme=ee-dp-fl",
            "privacy.sigma=0.5",
            "power.alpha=100",
        ],
    )
    with pytest.raises(ConfigError, match=r"power\.alpha.*100.*p_max_w"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_default_alpha_meets_power_bound_exactly(tiny_overrides: list[str]) -> None:
    cfg = load_experiment(
        None, [*tiny_overrides, "privacy.unit=device", "scheme=ee-dp-fl", "power.p_max_w=0.05"]
    )
    hw = load_hardware("sim")
    for up in resolve_uplinks(cfg, hw, 7850):
        power = expected_power_bound(
            d=7850,
            l=up.l,
            levels=up.levels,
            alpha=up.alpha,
            clip=cfg.clip.bound,
            sigma=up.sigma,
            mechanism=up.mechanism,
        )
        assert power * hw.tx_power_ref_w == pytest.approx(0.05)


def test_measured_power_respects_the_expected_bound(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(
        None, [*tiny_overrides, "privacy.unit=device", "scheme=ee-dp-fl", "rounds=2"]
    )
    run_experiment(cfg, tmp_path / "run")
    for m in RunDir(tmp_path / "run").metrics():
        for dev in m["devices"]:
            airtime = dev["airtime_s"]
            mean_power_w = dev["energy_comm_j"] / airtime
            # one upload may exceed the expectation; over all it stays within a few percent
            assert mean_power_w <= 1.2 * cfg.power.p_max_w


def test_resumed_run_has_the_same_ledger(tmp_path: Path, tiny_overrides: list[str]) -> None:
    args = [
        *tiny_overrides,
        "privacy.unit=device",
        "scheme=ee-dp-fl",
        "rounds=4",
        "fading=rayleigh",
        "snr_db=8",
    ]
    cfg = load_experiment(None, args)
    run_experiment(cfg, tmp_path / "full")

    def stop(line: dict) -> None:
        if line["round"] == 1:
            raise KeyboardInterrupt

    assert run_experiment(cfg, tmp_path / "cut", on_round=stop)["status"] == "interrupted"
    with Ledger.open(tmp_path / "cut" / "ledger.jsonl") as ledger:
        assert len(ledger.events()) == 2 * cfg.devices
    resume_experiment(tmp_path / "cut")
    with (
        Ledger.open(tmp_path / "full" / "ledger.jsonl") as a,
        Ledger.open(tmp_path / "cut" / "ledger.jsonl") as b,
    ):
        full, cut = a.events(), b.events()
        assert a.header == b.header
    assert full == cut and len(full) == 4 * cfg.devices
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["status"] == "completed"


def test_privacy_noise_does_not_follow_the_experiment_seed(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(
        None, [*tiny_overrides, "privacy.unit=device", "scheme=ldp-fedavg", "rounds=1"]
    )
    run_experiment(cfg, tmp_path / "a")
    run_experiment(cfg, tmp_path / "b")
    wa = RunDir(tmp_path / "a").load_checkpoint()
    wb = RunDir(tmp_path / "b").load_checkpoint()
    assert wa is not None and wb is not None
    assert not np.array_equal(wa[1], wb[1])  # same seed, fresh privacy noise
    with (
        Ledger.open(tmp_path / "a" / "ledger.jsonl") as a,
        Ledger.open(tmp_path / "b" / "ledger.jsonl") as b,
    ):
        assert a.events() == b.events()  # the same accounting, only the noise differs


def test_lost_upload_is_counted_without_channel_credit(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame the receiver loses still went on air: it is in the ledger, uncredited."""
    from radio.link import LinkError
    from radio.symbol_link import SymbolLink

    real = SymbolLink.transmit

    def lossy(self, *, device, round_index, symbols, rng):  # type: ignore[no-untyped-def]
        if device == 1 and round_index == 0:
            raise LinkError("no frame found (deep fade on the preamble)")
        return real(self, device=device, round_index=round_index, symbols=symbols, rng=rng)

    monkeypatch.setattr(SymbolLink, "transmit", lossy)
    cfg = load_experiment(
        None, [*tiny_overrides, "privacy.unit=device", "scheme=channel-dp", "rounds=2"]
    )
    run_experiment(cfg, tmp_path / "run")
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = {(e.device, e.round): e for e in ledger.events()}
    assert events[(1, 0)].trusted_channel_noise == 0.0 and events[(1, 0)].n0 == 0.0
    # sigma was calibrated assuming the channel credit every round: having lost it once,
    # device 1 would pass its target in round 1, so the guard keeps it silent.
    assert (1, 1) not in events and len(events) == 2 * cfg.devices - 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for dev in summary["privacy"]["devices"]:
        assert dev["epsilon_strict"] <= cfg.privacy.epsilon + 1e-9
    assert events[(0, 0)].trusted_channel_noise == 1.0
    first = RunDir(tmp_path / "run").metrics()[0]
    assert first["uploads"] == cfg.devices - 1
    assert first["devices"][1]["lost"] is True
