"""``testbed radio loopback``: send a known payload over a link and report the payload NMSE,
the SNR estimate and its confidence interval, the frequency-offset estimate and the samples
lost (registered by :mod:`testbed.cli.cmd_radio`)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import numpy as np

from radio.link import LinkError, LinkFailed
from radio.units import linear_to_db
from testbed.cli.cmd_radio import _emit
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import ConfigError, load_experiment, load_hardware
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


def _loopback_configs(
    args: argparse.Namespace, snr_db: float
) -> tuple[ExperimentConfig, HardwareConfig]:
    """The experiment and hardware configs of one loopback point; errors name the flag."""
    try:
        exp = load_experiment(None, [f"link={args.link}", f"snr_db={snr_db}", "devices=1"])
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


def _loopback_once(args: argparse.Namespace, snr_db: float) -> dict[str, Any]:
    exp, hw = _loopback_configs(args, snr_db)
    rng = np.random.default_rng(args.seed)
    nmse, expected, snr_est, covered, lost = [], [], [], [], 0
    frames_lost: list[str] = []
    last: dict[str, Any] = {}
    n0_true = 10 ** (-snr_db / 10)
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
            expected.append(float(np.mean(n0_true / np.abs(st.gain) ** 2)))
            covered.append(st.noise_var_lower <= n0_true <= st.noise_var_upper)
            lost += rec.samples_sent - rec.samples_received
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
    base = {
        "link": args.link, "hw_config": hw.name, "snr_db": snr_db, "cfo_hz": args.cfo_hz,
        "trials": args.trials, "n_symbols": args.n_symbols, "frames_lost": len(frames_lost),
    }
    if not nmse:
        return {**base, "error": frames_lost[-1]}
    return {
        **base,
        "nmse_db": float(linear_to_db(float(np.mean(nmse)))),
        "nmse_expected_db": float(linear_to_db(float(np.mean(expected)))),
        "snr_est_db": float(np.mean(snr_est)),
        "n0_ci_coverage": float(np.mean(covered)),
        "samples_lost": int(lost),
        **last,
    }


def cmd_loopback(args: argparse.Namespace) -> int:
    """Send a known payload over a link and report what came back.

    Without ``--snr-db`` the hardware config's ``snr_sweep_db`` is swept and the JSON object
    holds one result per point under ``sweep``. A bad flag is one ``testbed: error:`` line
    (exit 2); a link that fails to start or dies is one ``link failed`` message (exit 1).
    """
    _validate_loopback_args(args)
    try:
        return _loopback(args)
    except LinkFailed as exc:
        print(f"testbed radio loopback: link failed: {exc}", file=sys.stderr)
        return 1


def _loopback(args: argparse.Namespace) -> int:
    if args.snr_db is not None:
        result = _loopback_once(args, args.snr_db)
        if "error" in result:
            print(f"testbed radio loopback: every frame lost: {result['error']}", file=sys.stderr)
            return 1
        _emit(result, args.json, [f"{k}: {v}" for k, v in result.items()])
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
    _emit({"link": args.link, "hw_config": args.hw, "sweep": points}, args.json, lines)
    return 0
