"""``testbed radio loopback``: send a known payload over a link and report the payload NMSE,
the SNR estimate and its confidence interval, the frequency-offset estimate and the samples
lost (registered by :mod:`testbed.cli.cmd_radio`).

The emulated links (``symbol``, ``waveform``, ``gnuradio``) add noise at ``--snr-db``, so
that SNR is the truth the expected NMSE and the CI coverage are computed against. The
``usrp`` link's noise is the air's: on virtual radios the virtual air's link budget
(:func:`usrp_truth`) is the truth; on real USRPs there is none to compare with (those
numbers are ``null``, with the reason). ``--snr-db`` is refused on the ``usrp`` link.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import numpy as np

from radio.link import LinkError, LinkFailed
from radio.link_budget import budget_snr_db, path_gain
from radio.units import db_to_ratio, linear_to_db
from radio.virtual_device import VirtualArgs
from testbed.cli.output import emit
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.links import make_link

#: Largest ``--n-symbols`` accepted: a bigger payload only exhausts memory (5 samples per
#: symbol, several complex128 copies in modulation and synchronisation).
MAX_LOOPBACK_SYMBOLS = 2_000_000
#: Largest ``--trials`` accepted: each trial is one transmission over the link (seconds each
#: over a real flowgraph), so more only runs for days.
MAX_LOOPBACK_TRIALS = 10_000

#: Hardware-config keys that loopback sets from its flags.
_FLAG_OF_KEY = {"waveform.cfo_hz": "--cfo-hz", "waveform.delay_max_samples": "--delay-samples"}
#: Links whose emulated channel applies those keys (:func:`testbed.core.links.emulator_params`):
#: ``symbol`` carries symbols with no waveform, and ``usrp`` goes through real or virtual
#: radios (their own oscillators; a virtual air takes ``virtual_air.cfo_hz``).
_EMULATED_IMPAIRMENT_LINKS = ("waveform", "gnuradio")

#: ``--help`` of ``--snr-db`` (:mod:`testbed.cli.cmd_radio` registers the flag).
SNR_DB_HELP = (
    "symbol SNR (dB) of the emulated links symbol, waveform and gnuradio; default: sweep the "
    "hw config's snr_sweep_db. Refused on --link usrp, whose noise is the air's: one point "
    "at the virtual air's link-budget SNR (virtual radios), or at the unknown SNR of a real "
    "bench (nmse_expected_db and n0_ci_coverage null, with the reason)"
)


def usrp_truth(hw: HardwareConfig) -> tuple[float | None, str]:
    """The SNR the ``usrp`` link's frames really arrive with, and where it comes from.

    On virtual radios: the virtual air's link budget of the link's transmitter
    (``usrp.tx_args``' serial): ``tx_power_ref_w`` through its ``virtual_air.paths`` gain,
    against the receiver's thermal noise (``Es/N0`` of unit-power symbols, what the receiver
    estimates from its pilots as ``snr_est_db``), fading at its mean. On real USRPs the air's
    SNR is not known.

    Parameters
    ----------
    hw
        The loopback's hardware config.

    Returns
    -------
    snr_db
        The link budget's SNR (dB), or ``None`` when there is none.
    source
        Where ``snr_db`` comes from, or why there is none (one sentence).
    """
    if not hw.virtual:
        return None, ("real USRPs: the SNR over the air is not known to the testbed (no link "
                      "budget), so there is no truth for nmse_expected_db and n0_ci_coverage; "
                      "snr_est_db is the receiver's own estimate")
    air = hw.virtual_air
    serial = VirtualArgs.parse(hw.usrp.tx_args).serial
    path = air.path(serial)
    if path is None:  # the config's validation refuses this; kept for a hand-built config
        return None, (f"virtual radios, but usrp.tx_args' serial {serial!r} has no "
                      "virtual_air.paths entry: no link budget")
    gain = path_gain(attenuation_db=path.attenuation_db, distance_m=path.distance_m,
                     center_freq_hz=hw.center_freq_hz)
    snr = budget_snr_db(hw.tx_power_ref_w * gain, hw.symbol_rate_hz, air.temperature_k,
                        air.noise_figure_db)
    through = (f"{path.attenuation_db:g} dB" if path.attenuation_db is not None
               else f"{path.distance_m:g} m of free space")
    fading = "" if air.fading == "none" else f", {air.fading} fading at its mean"
    return snr, (f"virtual air link budget: tx_power_ref_w {hw.tx_power_ref_w:g} W through "
                 f"{serial}'s path ({through}) against kT*NF noise at {air.temperature_k:g} K, "
                 f"NF {air.noise_figure_db:g} dB{fading}")



def _check_number(flag: str, value: float, *, minimum: float | None = None) -> None:
    """Refuse NaN, infinities and values below ``minimum`` with a one-line ConfigError."""
    allowed = "a finite number" + (f" >= {minimum:g}" if minimum is not None else "")
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise ConfigError(f"{flag}: got {value}; allowed: {allowed}")


def _validate_loopback_args(args: argparse.Namespace) -> None:
    """Every numeric loopback flag, checked before any link is built."""
    if not 1 <= args.trials <= MAX_LOOPBACK_TRIALS:
        raise ConfigError(f"--trials: got {args.trials}; allowed: 1 .. {MAX_LOOPBACK_TRIALS}")
    if not 1 <= args.n_symbols <= MAX_LOOPBACK_SYMBOLS:
        raise ConfigError(
            f"--n-symbols: got {args.n_symbols}; allowed: 1 .. {MAX_LOOPBACK_SYMBOLS}"
        )
    if args.seed < 0:
        raise ConfigError(f"--seed: got {args.seed}; allowed: an integer >= 0")
    if args.snr_db is not None:
        _check_number("--snr-db", args.snr_db)
    _check_number("--cfo-hz", args.cfo_hz)
    if args.delay_samples is not None:
        _check_number("--delay-samples", args.delay_samples, minimum=0.0)
    if args.link not in _EMULATED_IMPAIRMENT_LINKS:
        given = [flag for flag, value in (("--cfo-hz", args.cfo_hz),
                                          ("--delay-samples", args.delay_samples))
                 if value not in (None, 0.0)]
        if given:
            raise ConfigError(
                f"{'/'.join(given)}: the {args.link} link does not apply "
                f"{'them' if len(given) > 1 else 'it'} (only the emulated channel of the "
                f"links {' and '.join(_EMULATED_IMPAIRMENT_LINKS)} adds a carrier offset and "
                "a delay); use --link waveform or --link gnuradio, or leave "
                f"{'them' if len(given) > 1 else 'it'} out"
            )
    if args.snr_db is not None and args.link == "usrp":
        raise ConfigError(
            f"--snr-db: got {args.snr_db:g}; the usrp link does not set its SNR (its noise is "
            "the air's: the virtual air's link budget, or a real bench's); leave --snr-db "
            "out, or use an emulated link (symbol, waveform, gnuradio)"
        )


def _loopback_configs(
    args: argparse.Namespace, snr_db: float | None
) -> tuple[ExperimentConfig, HardwareConfig]:
    """The experiment and hardware configs of one loopback point (``snr_db`` ``None``: the
    experiment's default, for the usrp link, which does not use it); errors name the flag."""
    snr = [] if snr_db is None else [f"snr_db={snr_db}"]
    try:
        exp = load_experiment(None, [f"link={args.link}", *snr, "devices=1"])
    except ConfigError as exc:
        raise ConfigError(f"--snr-db: {exc}") from None
    hw_over = [f"waveform.cfo_hz={args.cfo_hz!r}", "waveform.cfo_spread_hz=0"]
    if args.delay_samples is not None:
        hw_over.append(f"waveform.delay_max_samples={args.delay_samples!r}")
    load_hardware(args.hw)  # the file's own errors, reported as they are
    try:
        hw = load_hardware(args.hw, hw_over)
    except ConfigError as exc:
        flags = [flag for key, flag in _FLAG_OF_KEY.items() if key in str(exc)]
        raise ConfigError(f"{'/'.join(flags) or '--hw'}: {exc}") from None
    return exp, hw


def _loopback_once(args: argparse.Namespace, snr_db: float | None) -> dict[str, Any]:
    """One loopback point: ``args.trials`` uploads at ``snr_db`` (emulated links), or at the
    air's SNR (``usrp`` link, ``snr_db`` ``None``)."""
    exp, hw = _loopback_configs(args, snr_db)
    rng = np.random.default_rng(args.seed)
    nmse, expected, snr_est, covered, lost = [], [], [], [], 0
    frames_lost: list[str] = []
    last: dict[str, Any] = {}
    air = args.link == "usrp"
    n0_true: float | None = None  # the noise variance an emulated channel adds
    if air:
        truth_db, source = usrp_truth(hw)
        # The receive window: the burst and a capture margin on either side.
        margin = int(2 * hw.usrp.capture_margin_s * hw.sample_rate_hz)
    else:
        assert snr_db is not None
        truth_db, source, margin = snr_db, "", 0
        n0_true = db_to_ratio(-snr_db)
    try:
        link = make_link(exp, hw)
    except ValueError as exc:  # ConfigError included: a setting the link cannot honour
        raise ConfigError(f"--link {args.link} on hardware config '{hw.name}': {exc}") from None
    with link:
        for trial in range(args.trials):
            x = (rng.standard_normal(args.n_symbols) + 1j * rng.standard_normal(args.n_symbols))
            x /= np.sqrt(2)
            try:
                rec = link.transmit(device=0, round_index=trial, symbols=x, rng=rng)
            except LinkFailed:
                raise
            except LinkError as exc:
                frames_lost.append(str(exc))
                continue
            st = rec.state
            nmse.append(float(np.mean(np.abs(rec.symbols / st.gain - x) ** 2)))
            lost += max(0, rec.samples_sent + margin - rec.samples_received)
            gp = max(st.mean_gain_power(), 1e-300)
            snr_est.append(float(linear_to_db(gp / st.noise_var)) if st.noise_var > 0 else np.inf)
            last = {
                "snr_ci_db": [float(linear_to_db(gp / st.noise_var_upper)),
                              float(linear_to_db(gp / max(st.noise_var_lower, 1e-300)))],
                "cfo_est_hz": float(rec.info.get("cfo_est_hz", 0.0)),
                "airtime_s": rec.airtime_s,
            }
            if "snr_est_db" in rec.info:
                snr_est[-1] = float(rec.info["snr_est_db"])
                last["snr_ci_db"] = [float(rec.info["snr_ci_lo_db"]),
                                     float(rec.info["snr_ci_hi_db"])]
            if n0_true is not None:  # emulated: the noise variance the channel added
                expected.append(float(np.mean(n0_true / np.abs(st.gain) ** 2)))
                covered.append(st.noise_var_lower <= n0_true <= st.noise_var_upper)
            elif truth_db is not None:  # the air's link budget, in the receiver's gain scale
                n0_air = gp * db_to_ratio(-truth_db)
                expected.append(float(np.mean(n0_air / np.abs(st.gain) ** 2)))
                lo, hi = last["snr_ci_db"]
                covered.append(lo <= truth_db <= hi)
    base = {
        "link": args.link, "hw_config": hw.name, "snr_db": truth_db, "cfo_hz": args.cfo_hz,
        "trials": args.trials, "n_symbols": args.n_symbols, "frames_lost": len(frames_lost),
    }
    if air:
        base["snr_source"] = source
    if not nmse:
        return {**base, "error": frames_lost[-1]}
    out = {
        **base,
        "nmse_db": float(linear_to_db(float(np.mean(nmse)))),
        "nmse_expected_db": (float(linear_to_db(float(np.mean(expected))))
                             if expected else None),
        "snr_est_db": float(np.mean(snr_est)),
        "n0_ci_coverage": float(np.mean(covered)) if covered else None,
        "samples_lost": int(lost),
        **last,
    }
    if truth_db is None:
        out["no_truth_reason"] = source
    return out


def cmd_loopback(args: argparse.Namespace) -> int:
    """Send a known payload over a link and report what came back.

    Without ``--snr-db`` the hardware config's ``snr_sweep_db`` is swept and the JSON object
    holds one result per point under ``sweep``. The ``usrp`` link refuses ``--snr-db`` and
    runs one point at the air's SNR (``snr_db``: the virtual air's link budget, ``null`` on
    real USRPs; ``snr_source`` says which). A bad flag is one ``testbed: error:`` line
    (exit 2); a link that fails to start or dies is one ``link failed`` message (exit 1).
    """
    _validate_loopback_args(args)
    try:
        return _loopback(args)
    except LinkFailed as exc:
        print(f"testbed radio loopback: link failed: {exc}", file=sys.stderr)
        return 1


def _loopback(args: argparse.Namespace) -> int:
    if args.snr_db is not None or args.link == "usrp":
        result = _loopback_once(args, args.snr_db)
        if "error" in result:
            print(f"testbed radio loopback: every frame lost: {result['error']}", file=sys.stderr)
            return 1
        emit(result, args.json, [f"{k}: {v}" for k, v in result.items()])
        return 0
    sweep = load_hardware(args.hw).snr_sweep_db
    if not sweep:
        raise ConfigError(
            f"--snr-db: not given, and hardware config '{args.hw}' has no snr_sweep_db"
        )
    points = [_loopback_once(args, float(s)) for s in sweep]
    lines = [
        f"{p['snr_db']:6.1f} dB: "
        + (f"nmse {p['nmse_db']:7.2f} dB, snr_est {p['snr_est_db']:6.2f} dB"
           if "error" not in p else f"frame lost ({p['error']})")
        for p in points
    ]
    emit({"link": args.link, "hw_config": args.hw, "sweep": points}, args.json, lines)
    return 0
