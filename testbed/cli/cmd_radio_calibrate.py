"""``testbed radio calibrate HW_CONFIG``: a bench's first-day radio measurement (docs/lab.md,
"Calibration"), registered by :mod:`testbed.cli.cmd_radio`.

Measures every transmitter of the config through the cable or the air to the receiver
(transmit power against amplitude and where it compresses, carrier offset, timing error of
timed bursts, drift, PPS agreement, the late-burst report), the receiver (noise floor and
its lower bound, overflows, real-time margin) and the guard and deadline these need
(:mod:`testbed.radio_calibration.measure`). ``--out CAL.yaml`` writes the calibration a
hardware config includes (``calibration: CAL.yaml``) and ``CAL.md``, a report with a figure
per measurement. On virtual radios ``--check-truth`` compares every quantity with the
config's true values (:mod:`testbed.radio_calibration.truth`).

Exit codes: 0 measured, nothing wrong; 1 a problem found (late burst unreported or on the
air, a PPS second apart, overflows, bursts lost) or a truth check failed; 2 bad input;
5 radios missing or a flowgraph failed (one line, naming them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from radio.link import LinkFailed
from radio.units import db_to_ratio
from testbed.cli.output import emit
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_hardware
from testbed.core.config.safe_yaml import dump_yaml_text
from testbed.radio_calibration.measure import (
    LADDER,
    CalibrateOptions,
    RadiosMissing,
    calibrate,
)
from testbed.radio_calibration.report import summary_lines, write_report
from testbed.radio_calibration.truth import check_against_truth, virtual_truth

#: ``--help``'s description.
DESCRIPTION = (
    "Measure a bench's radios before its first run (docs/lab.md, 'Calibration'): per "
    "transmitter, through the cable or the air to the receiver, the transmit power against "
    "DAC amplitude (with --attenuation-db) and where it compresses, the carrier offset, the "
    "timing error of timed bursts against tx_time, clock drift and PPS agreement, and that a "
    "late burst is reported and not sent; the receiver's noise floor N0 and its lower bound "
    "per gain, overflows and real-time margin; the guard and deadline these need. --out "
    "CAL.yaml writes the calibration (include it in the hardware config: calibration: "
    "CAL.yaml) and CAL.md, a report with a figure per measurement. On virtual radios "
    "--check-truth compares each quantity with the config's true values. Exit 0: nothing "
    "wrong; 1: a problem found or a truth check failed; 2: bad input; 5: radios missing or a "
    "flowgraph failed (one line naming them).")
#: Exit code of missing radios or a failed flowgraph (a run's ``link_failed``).
EXIT_RADIOS = 5


def _attenuation(items: list[str]) -> dict[int | None, float]:
    out: dict[int | None, float] = {}
    for item in items:
        dev, sep, value = item.rpartition(":")
        try:
            key = int(dev) if sep else None
            out[key] = float(value)
        except ValueError:
            raise ConfigError(f"--attenuation-db: got {item!r}; allowed: DB (every device) or "
                              "DEVICE:DB, e.g. 116 or 2:118.5") from None
    return out


def _train_times(items: list[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for item in items:
        dev, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(dev)] = float(value)
        except ValueError:
            raise ConfigError(f"--train-time: got {item!r}; allowed: DEVICE=SECONDS, e.g. "
                              "0=4.2") from None
    return out


def _devices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise ConfigError(f"--devices: got {text!r}; allowed: device ids, e.g. 0,2,3")
    return ids


def options(args: argparse.Namespace) -> CalibrateOptions:
    """The measurement options of the parsed flags.

    Raises
    ------
    ConfigError
        A flag's value is not allowed (names the flag, the value and what is allowed).
    """
    opts = CalibrateOptions(
        devices=_devices(args.devices), attenuation_db=_attenuation(args.attenuation_db),
        bursts=args.bursts, n_symbols=args.burst_symbols, spacing_s=args.spacing,
        ladder=LADDER, noise_s=args.noise_seconds, stream_s=args.stream_seconds,
        rx_gains_db=args.rx_gain or None, rx_full_scale_w=args.rx_full_scale_w,
        train_times_s=_train_times(args.train_time), late_burst=not args.no_late_burst,
        confidence=args.confidence)
    opts.check()
    return opts


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure, print, and with ``--out`` write the calibration and its report."""
    hw = load_hardware(args.hw_config, args.hw_set)
    if hw.link != "usrp":
        raise ConfigError(f"HW_CONFIG: hardware config '{hw.name}' has link {hw.link}: no "
                          "radios to calibrate; allowed: a config with link: usrp (its "
                          "usrp section's radios, real or virtual)")
    opts = options(args)
    if args.check_truth and not hw.virtual:
        raise ConfigError(f"--check-truth: hardware config '{hw.name}' is not virtual: its "
                          "radios' true values are not known")
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--out: got '{out}'; allowed: a .yaml path (CAL.yaml)")
    log_dir = Path(args.log_dir) if args.log_dir else (
        out.parent / f"{out.stem}-logs" if out else Path("calibration-logs"))

    def progress(line: str) -> None:
        if not args.json:
            print(f"calibrate: {line}", file=sys.stderr, flush=True)

    try:
        m = calibrate(hw, opts, log_dir=log_dir, progress=progress)
    except RadiosMissing as exc:
        print(f"testbed radio calibrate: {exc}", file=sys.stderr)
        return EXIT_RADIOS
    except (LinkFailed, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"testbed radio calibrate: radio failed: {first} (logs in {log_dir})",
              file=sys.stderr)
        return EXIT_RADIOS
    cal = m.calibration
    checks = check_against_truth(cal, hw) if args.check_truth else None
    files: list[str] = []
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        data = cal.model_dump(mode="json", exclude={"source"})
        out.write_text("# written by testbed radio calibrate; include it in the hardware "
                       f"config with: calibration: {out.name}\n" + dump_yaml_text(data))
        true_n0: dict[float, float] = {}
        if hw.virtual and cal.receiver is not None and cal.receiver.full_scale_w:
            n0 = virtual_truth(hw).n0_w_per_hz
            true_n0 = {f.rx_gain_db: n0 * hw.sample_rate_hz * db_to_ratio(f.rx_gain_db)
                       / cal.receiver.full_scale_w for f in cal.receiver.noise}
        written = write_report(m, out.with_suffix(".md"), checks=checks,
                               true_n0_sample=true_n0, cal_path=out)
        files = [str(out), *(str(p) for p in written)]
    failed = bool(cal.problems) or any(not c.ok for c in checks or [])
    result = {"calibration": cal.model_dump(mode="json"), "files": files,
              "checks": [c.__dict__ for c in checks or []], "ok": not failed}
    lines = summary_lines(cal, checks) + [f"wrote {f}" for f in files]
    emit(result, args.json, lines)
    return 1 if failed else 0


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``calibrate`` to ``testbed radio``'s subcommands."""
    c = sub.add_parser("calibrate", help="measure the radios of a hardware config (power, "
                       "CFO, timing, clocks, noise floor, overflows, late bursts)",
                       description=DESCRIPTION)
    c.add_argument("hw_config", metavar="HW_CONFIG", help="name in hw_configs/ or a YAML path")
    c.add_argument("--devices", default=None, metavar="I,J",
                   help="device ids to measure (default: every usrp.devices entry)")
    c.add_argument("--attenuation-db", action="append", default=[], metavar="[DEVICE:]DB",
                   help="known loss (dB) from a transmitter to the receiver (cable and "
                   "attenuator): the transmit power is measured through it; repeat as "
                   "DEVICE:DB per device; without it only the received power is")
    c.add_argument("--out", default=None, metavar="CAL.yaml",
                   help="write the calibration here, and CAL.md (report) with its figures")
    c.add_argument("--bursts", type=int, default=20, help="timed bursts per transmitter")
    c.add_argument("--burst-symbols", type=int, default=2000, help="payload symbols a burst")
    c.add_argument("--spacing", type=float, default=0.1, help="seconds between bursts")
    c.add_argument("--noise-seconds", type=float, default=10.0,
                   help="noise-only capture per receive gain (s)")
    c.add_argument("--stream-seconds", type=float, default=60.0,
                   help="the receiver streams at least this long in all: overflows (s)")
    c.add_argument("--rx-gain", type=float, action="append", default=[], metavar="DB",
                   help="receive gain to measure the noise floor at (repeat; default "
                   "usrp.rx_gain_db)")
    c.add_argument("--rx-full-scale-w", type=float, default=None, metavar="W",
                   help="a real receiver's input power reading full scale at 0 dB gain "
                   "(absolute powers rest on it; a virtual one's is known)")
    c.add_argument("--train-time", action="append", default=[], metavar="DEVICE=SECONDS",
                   help="an edge's measured training time for the configured job (repeat): "
                   "sets the deadline")
    c.add_argument("--no-late-burst", action="store_true",
                   help="do not send a burst late on purpose")
    c.add_argument("--confidence", type=float, default=0.95,
                   help="level of the N0 lower bound and the intervals")
    c.add_argument("--check-truth", action="store_true",
                   help="virtual radios: compare every quantity with the config's true values")
    c.add_argument("--log-dir", default=None, help="flowgraph and air logs (default: beside "
                   "--out)")
    c.add_argument("--hw-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware config key")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_calibrate)
