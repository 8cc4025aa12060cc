"""``testbed privacy`` and ``testbed privacy-curve``: epsilon of the piggyback DP scheme.

``privacy`` evaluates, by default as a run does (``privacy.unit: record``,
``privacy.accountant: pld``), the record-level epsilon of K Poisson-subsampled Gaussian steps
(dp-accounting, PLD or RDP); with ``--unit device``, one device's epsilon after K identical
uploads under the ``paper`` (003 Theorem 1 / Proposition 1, corrected) or ``strict``
accounting (docs/privacy.md).
``privacy-curve`` regenerates 003 Fig. 2(b)/(c): epsilon versus receive SNR over AWGN and
Rayleigh block fading, piggyback against channel only, as CSV and PNG.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.config.errors import ConfigError
from testbed.core.config.paths import check_output_dir

#: MNIST CNN of 003 (two 5x5 conv layers, FC 50, softmax): 21,840 parameters.
DEFAULT_D = 21840
#: Upper limits of the numeric arguments, so the accountant's arithmetic cannot overflow
#: (the same limits as the experiment config: clip.bound, privacy.sigma <= 1e6,
#: power.alpha <= 1e9).
MAX_SIGMA = 1e6
MAX_CLIP = 1e6
MAX_ALPHA = 1e9
MAX_GAIN = 1e6
MAX_N0 = 1e12
#: privacy-curve: SNR range (dB), points per curve, Rayleigh draws (realizations x rounds).
MAX_SNR_DB = 200.0
MAX_SNR_POINTS = 10_001
MAX_DRAWS = 10_000_000


def register(sub: Any) -> None:
    """Add the ``privacy`` and ``privacy-curve`` subcommands."""
    p = sub.add_parser(
        "privacy",
        help="epsilon of one record (default, as a run) or one device after K steps/uploads",
        description=(
            "Defaults as a run's (privacy.unit: record, privacy.accountant: pld): the "
            "record-level epsilon of --steps K Poisson-subsampled Gaussian steps at sampling "
            "rate --q and noise multiplier --z (dp-accounting). With --unit device: the "
            "epsilon of one device after K identical uploads x = alpha C(g + eta) received as "
            "y = h x + n. N0 is the channel noise variance per REAL coordinate (a complex "
            "symbol with E|n|^2 = N0c carries N0c/2 on each of I and Q). Accountings: 'paper' "
            "(003 Theorem 1/Proposition 1 corrected: K uploads, kappa capped at l) and "
            "'strict' (textbook DP steps; channel noise credited only where the map to the air "
            "is linear). See docs/privacy.md."
        ),
    )
    p.add_argument("--unit", default="record", choices=["record", "device"],
                   help="record (default, as a run's privacy.unit): one sample, K "
                        "Poisson-subsampled Gaussian steps (--q, --z, --steps, --accountant, "
                        "--relation); device: a device's whole update (--sigma, --alpha, --h, "
                        "--n0, --rounds, --l, --q, --mode)")
    p.add_argument("--sigma", type=float, help="artificial noise std per coordinate (device)")
    p.add_argument("--alpha", type=float, help="power scaling of C(g + eta) (device)")
    p.add_argument("--h", type=float, help="credited channel gain |h| (>= 0) (device)")
    p.add_argument("--n0", type=float, help="noise variance per real coordinate (device)")
    p.add_argument("--rounds", type=int, help="K, number of uploads (device)")
    p.add_argument("--d", type=int, default=DEFAULT_D, help=f"model size (default {DEFAULT_D})")
    p.add_argument("--l", type=int, help="coordinates sent (default d: no sparsification)")
    p.add_argument("--q", type=_number,
                   help="device: quantization levels Q (default: no quantization); "
                        "record: Poisson sampling rate in (0, 1]")
    p.add_argument("--z", type=float, help="record: noise multiplier std / (C/B), > 0")
    p.add_argument("--steps", type=int, help="record: K, number of subsampled Gaussian steps")
    p.add_argument("--accountant", choices=["pld", "rdp"],
                   help="record: dp-accounting PLD (default, as a run's privacy.accountant) "
                        "or RDP")
    p.add_argument("--relation", choices=["add-remove", "replace-one"],
                   help="record: neighbouring data sets (default add-remove)")
    p.add_argument("--clip", type=float, default=5.0, help="Z, l2 clip bound (default 5)")
    p.add_argument("--clip-mode", default="coordinate", choices=["coordinate", "norm"],
                   help="coordinate: |g_j| <= Z/sqrt(d) (default); norm: ||g|| <= Z")
    p.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument("--mode", default="strict", choices=["paper", "strict"],
                   help="device: accounting (default strict)")
    p.add_argument("--noise-position", default="before", choices=["before", "after"],
                   help="artificial noise before (Algorithm 1) or after (eq. 21) compression; "
                        "'after' with --q assumes a fixed public quantizer scale")
    p.add_argument("--trusted", type=float, default=1.0,
                   help="fraction of channel noise credited, in [0, 1] (default 1)")
    p.add_argument("--conversion", default="standard", choices=["standard", "balle2020"],
                   help="RDP to (eps, delta) conversion (default standard, 003 Lemma 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_privacy)

    c = sub.add_parser(
        "privacy-curve",
        help="device-level epsilon vs SNR, piggyback vs channel only (003 Fig. 2(b)/(c))",
        description=(
            "Device-level epsilon (the unit: a device's whole update over K uploads, as 003's "
            "figure; not the record unit a run enforces by default) versus receive SNR for "
            "AWGN and Rayleigh block fading (mean and std over "
            "channel realizations), for channel only (no compression, no artificial noise), "
            "piggyback (sparsification + quantization) and piggyback without quantization, "
            "under both accountings. SNR is that of a unit-power complex stream at unit gain "
            "(N0 = 10^(-SNR/10)); each scheme scales by a data-independent alpha for unit "
            f"expected symbol power. Defaults: d = {DEFAULT_D} (MNIST CNN), l = 0.1 d, Q = 16, "
            "Z = 5 (coordinate clipping), sigma = 0, K = 50 uploads, delta = 1e-5, "
            "SNR from -80 to -20 dB; in d = 21,840 dimensions the channel alone protects "
            "only at very low per-symbol SNR. Writes privacy_curve.csv and privacy_curve.png."
        ),
    )
    c.add_argument("--out", type=Path, default=Path("."), help="output directory (default .)")
    c.add_argument("--d", type=int, default=DEFAULT_D, help=f"model size (default {DEFAULT_D})")
    c.add_argument("--l", type=int, help="coordinates sent by piggyback (default round(0.1 d))")
    c.add_argument("--q", type=int, default=16, help="quantization levels (default 16)")
    c.add_argument("--sigma", type=float, default=0.0, help="piggyback artificial noise std")
    c.add_argument("--clip", type=float, default=5.0, help="Z (default 5)")
    c.add_argument("--rounds", type=int, default=50, help="K uploads (default 50)")
    c.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    c.add_argument("--trusted", type=float, default=1.0, help="credited channel-noise fraction")
    c.add_argument("--snr-min", type=float, default=-80.0, help="lowest SNR in dB (default -80)")
    c.add_argument("--snr-max", type=float, default=-20.0, help="highest SNR in dB (default -20)")
    c.add_argument("--snr-step", type=float, default=5.0, help="SNR step in dB (default 5)")
    c.add_argument("--realizations", type=int, default=100,
                   help="Rayleigh channel realizations per SNR (default 100)")
    c.add_argument("--seed", type=int, default=0, help="seed of the simulated fading draws")
    c.add_argument("--no-plot", action="store_true", help="write the CSV only")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=_curve)


def _fail(message: str) -> None:
    raise ConfigError(message)


def _number(text: str) -> int | float:
    """An integer if ``text`` is one, else a float (``--q`` serves both units)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None


#: --unit record: most steps composed (PLD memory is bounded whatever K, see
#: testbed/core/privacy/analysis/pld_bounded.py; the time still grows about as log K).
MAX_RECORD_STEPS = 10_000_000
#: Options of one unit that the other unit refuses (both default to None).
_DEVICE_ONLY = ("sigma", "alpha", "h", "n0", "rounds", "l")
_RECORD_ONLY = ("z", "steps", "accountant", "relation")


def _only_for(args: argparse.Namespace, unit: str, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(args, name) is not None:
            default = " (the default unit is record, as in a run)" if unit == "device" else ""
            _fail(f"--{name} applies only to --unit {unit}{default}")


def _privacy(args: argparse.Namespace) -> int:
    from testbed.core.privacy import epsilon_for

    if args.unit == "record":
        return _privacy_record(args)
    _only_for(args, "record", _RECORD_ONLY)
    missing = [f"--{n}" for n in ("sigma", "alpha", "h", "n0", "rounds")
               if getattr(args, n) is None]
    if missing:
        _fail(f"the following arguments are required: {', '.join(missing)}")
    l = args.d if args.l is None else args.l
    checks = [
        ("--sigma", args.sigma, 0 <= args.sigma <= MAX_SIGMA, f"in [0, {MAX_SIGMA:g}]"),
        ("--alpha", args.alpha, 0 <= args.alpha <= MAX_ALPHA, f"in [0, {MAX_ALPHA:g}]"),
        ("--h", args.h, 0 <= args.h <= MAX_GAIN, f"in [0, {MAX_GAIN:g}]"),
        ("--n0", args.n0, 0 <= args.n0 <= MAX_N0, f"in [0, {MAX_N0:g}]"),
        ("--rounds", args.rounds, args.rounds >= 0, "an integer >= 0"),
        ("--d", args.d, args.d >= 1, "an integer >= 1"),
        ("--l", l, 1 <= l <= args.d, f"an integer in [1, d={args.d}]"),
        ("--q", args.q, args.q is None or (isinstance(args.q, int) and args.q >= 1),
         "an integer >= 1"),
        ("--clip", args.clip, 0 < args.clip <= MAX_CLIP, f"in (0, {MAX_CLIP:g}]"),
        ("--delta", args.delta, 0 < args.delta < 1, "in (0, 1)"),
        ("--trusted", args.trusted, 0 <= args.trusted <= 1, "in [0, 1]"),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            _fail(f"{name}={value} is not allowed; must be {allowed}")
    res = epsilon_for(
        mode=args.mode, sigma=args.sigma, alpha=args.alpha, h=args.h, n0=args.n0,
        rounds=args.rounds, d=args.d, l=l, q=args.q, clip=args.clip, delta=args.delta,
        trusted=args.trusted, clip_mode=args.clip_mode, noise_position=args.noise_position,
        conversion=args.conversion,
    )
    out = {
        "epsilon": _num(res.epsilon),
        "order": _num(res.order),
        "mode": res.mode,
        "delta": args.delta,
        "conversion": res.conversion,
        "rounds": res.uploads,
        "rdp_coefficient": _num(res.rdp_coefficient),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"epsilon = {res.epsilon:.6g} at Renyi order {res.order:.6g} "
              f"(delta = {args.delta:g}, {res.mode} accounting, {res.conversion} conversion, "
              f"K = {res.uploads})")
    return 0


def _privacy_record(args: argparse.Namespace) -> int:
    """``--unit record``: epsilon of ``--steps`` identical Poisson-subsampled Gaussian steps."""
    from testbed.core.privacy import record_epsilon_for

    _only_for(args, "device", _DEVICE_ONLY)
    missing = [f"--{n}" for n in ("q", "z", "steps") if getattr(args, n) is None]
    if missing:
        _fail(f"the following arguments are required with --unit record: {', '.join(missing)}")
    checks = [
        ("--q", args.q, 0 < args.q <= 1, "in (0, 1]"),
        ("--z", args.z, args.z > 0 and math.isfinite(args.z), "> 0 and finite"),
        ("--steps", args.steps, 1 <= args.steps <= MAX_RECORD_STEPS,
         f"an integer in [1, {MAX_RECORD_STEPS}]"),
        ("--delta", args.delta, 0 < args.delta < 1, "in (0, 1)"),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            _fail(f"{name}={value} is not allowed; must be {allowed}")
    accountant = args.accountant or "pld"
    relation = args.relation or "add-remove"
    res = record_epsilon_for(q=float(args.q), z=args.z, steps=args.steps, delta=args.delta,
                             accountant=accountant, relation=relation)
    out = {
        "epsilon": _num(res.epsilon),
        "unit": "record",
        "accountant": res.accountant,
        "relation": res.relation,
        "delta": args.delta,
        "q": float(args.q),
        "z": args.z,
        "steps": args.steps,
        "order": _num(res.order),
        "order_at_edge": res.order_at_edge,
    }
    if args.json:
        print(json.dumps(out))
    else:
        order = f" at Renyi order {res.order:.6g}" if accountant == "rdp" else ""
        print(f"epsilon = {res.epsilon:.6g}{order} (record level, {accountant}, {relation}, "
              f"delta = {args.delta:g}, q = {float(args.q):g}, z = {args.z:g}, "
              f"K = {args.steps})")
    return 0


def _num(x: float) -> float | str:
    """JSON has no inf/nan: write them as strings."""
    return x if math.isfinite(x) else str(x)


def _curve(args: argparse.Namespace) -> int:
    from testbed.core.privacy.analysis.curve import Scheme, epsilon_over_gains

    d = args.d
    l = max(1, round(0.1 * d)) if args.l is None else args.l
    checks = [
        ("--d", d, d >= 1, "an integer >= 1"),
        ("--l", l, 1 <= l <= d, f"an integer in [1, d={d}]"),
        ("--q", args.q, args.q >= 1, "an integer >= 1"),
        ("--sigma", args.sigma, 0 <= args.sigma <= MAX_SIGMA, f"in [0, {MAX_SIGMA:g}]"),
        ("--clip", args.clip, 0 < args.clip <= MAX_CLIP, f"in (0, {MAX_CLIP:g}]"),
        ("--rounds", args.rounds, 1 <= args.rounds <= MAX_DRAWS, f"an integer in [1, {MAX_DRAWS}]"),
        ("--delta", args.delta, 0 < args.delta < 1, "in (0, 1)"),
        ("--trusted", args.trusted, 0 <= args.trusted <= 1, "in [0, 1]"),
        ("--snr-min", args.snr_min, -MAX_SNR_DB <= args.snr_min <= MAX_SNR_DB,
         f"in [-{MAX_SNR_DB:g}, {MAX_SNR_DB:g}] dB"),
        ("--snr-max", args.snr_max, -MAX_SNR_DB <= args.snr_max <= MAX_SNR_DB,
         f"in [-{MAX_SNR_DB:g}, {MAX_SNR_DB:g}] dB"),
        ("--snr-step", args.snr_step, 0 < args.snr_step <= 2 * MAX_SNR_DB, "> 0"),
        ("--snr-max", args.snr_max, args.snr_max >= args.snr_min, ">= --snr-min"),
        ("--realizations", args.realizations, 2 <= args.realizations <= MAX_DRAWS,
         f"an integer in [2, {MAX_DRAWS}]"),
        ("--seed", args.seed, args.seed >= 0, "an integer >= 0"),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            _fail(f"{name}={value} is not allowed; must be {allowed}")
    if args.realizations * args.rounds > MAX_DRAWS:
        _fail(f"--realizations x --rounds = {args.realizations * args.rounds} is not allowed; "
              f"must be at most {MAX_DRAWS} channel draws")
    n_snr = (args.snr_max - args.snr_min) / args.snr_step + 1
    if n_snr > MAX_SNR_POINTS:
        _fail(f"--snr-min/--snr-max/--snr-step give {n_snr:.4g} SNR points; allowed: at most "
              f"{MAX_SNR_POINTS} (use a larger --snr-step)")
    check_output_dir(args.out, "--out")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"--out={args.out}: cannot create the directory ({exc.strerror or exc})")

    schemes = [
        Scheme("channel-only", d, None, 0.0),
        Scheme("piggyback", l, args.q, args.sigma),
        Scheme("piggyback-no-quantization", l, None, args.sigma),
    ]
    snrs = np.arange(args.snr_min, args.snr_max + 1e-9, args.snr_step)
    # Fading draws are channel simulation, not privacy noise: a seeded generator is right.
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([args.seed, 4])))
    rayleigh = np.sqrt(rng.exponential(1.0, size=(args.realizations, args.rounds)))
    awgn = np.ones((1, args.rounds))
    rows: list[dict[str, Any]] = []
    for channel, gains in (("awgn", awgn), ("rayleigh", rayleigh)):
        for mode in ("paper", "strict"):
            for scheme in schemes:
                for snr in snrs:
                    eps = epsilon_over_gains(
                        mode=mode, scheme=scheme, gains=gains, snr_db=float(snr), d=d,
                        clip=args.clip, delta=args.delta, trusted=args.trusted,
                    )
                    finite = bool(np.all(np.isfinite(eps)))
                    rows.append({
                        "channel": channel, "mode": mode, "scheme": scheme.name,
                        "snr_db": float(snr),
                        "eps_mean": float(np.mean(eps)) if finite else math.inf,
                        "eps_std": float(np.std(eps, ddof=1)) if finite and eps.size > 1 else 0.0,
                    })
    csv_path = args.out / "privacy_curve.csv"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(
            fh, fieldnames=["channel", "mode", "scheme", "snr_db", "eps_mean", "eps_std"]
        )
        writer.writeheader()
        writer.writerows(rows)
    below = _below(rows, "piggyback")
    below_noq = _below(rows, "piggyback-no-quantization")
    png_path = None if args.no_plot else _plot(rows, args.out / "privacy_curve.png", args)
    summary = {
        "csv": str(csv_path),
        "png": None if png_path is None else str(png_path),
        "unit": "device", "accountings": ["paper", "strict"], "conversion": "standard",
        "trust": _trust(args.trusted),
        "d": d, "l": l, "q": args.q, "sigma": args.sigma, "clip": args.clip,
        "rounds": args.rounds, "delta": args.delta, "trusted": args.trusted,
        "snr_db": [float(s) for s in snrs],
        "piggyback_below_channel_only": below,
        "piggyback_no_quantization_below_channel_only": below_noq,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {csv_path}" + ("" if png_path is None else f" and {png_path}"))
        for key in ("piggyback_below_channel_only", "piggyback_no_quantization_below_channel_only"):
            print(f"{key}: {summary[key]}")
    return 0


def _below(rows: list[dict[str, Any]], scheme: str) -> dict[str, bool]:
    """Per channel and mode: is ``scheme``'s mean epsilon below channel only at every SNR?"""
    out: dict[str, bool] = {}
    for channel in ("awgn", "rayleigh"):
        for mode in ("paper", "strict"):
            sel = {r["snr_db"]: r["eps_mean"] for r in rows
                   if r["channel"] == channel and r["mode"] == mode and r["scheme"] == scheme}
            ref = {r["snr_db"]: r["eps_mean"] for r in rows
                   if r["channel"] == channel and r["mode"] == mode
                   and r["scheme"] == "channel-only"}
            out[f"{channel}/{mode}"] = all(sel[s] < ref[s] for s in ref)
    return out


def _trust(trusted: float) -> str:
    """The trust assumption of the curve's channel credit, in words."""
    if trusted == 0:
        return "no channel noise credited (an eavesdropper with a noiseless channel)"
    return (f"fraction {trusted:g} of the receiver's channel noise credited (an eavesdropper "
            "no better than the aggregator's receiver)")


def curve_title(args: argparse.Namespace, l: int) -> str:
    """The privacy-curve figure's title: unit, delta, accountings and trust assumption.

    Parameters
    ----------
    args
        ``privacy-curve``'s arguments (``d``, ``q``, ``sigma``, ``clip``, ``rounds``,
        ``delta``, ``trusted``).
    l
        Coordinates piggyback sends.

    Returns
    -------
    str
        Four lines.
    """
    return (
        f"Device-level epsilon (unit: one device's whole update, K = {args.rounds} uploads), "
        f"delta = {args.delta:g}\n"
        "accountants: paper (003 Thm 1 corrected, RDP; not a DP bound; solid) and strict "
        "(RDP; dashed), standard conversion\n"
        f"trust: {_trust(args.trusted)}\n"
        f"d = {args.d}, piggyback l = {l}, Q = {args.q}, sigma = {args.sigma:g}, "
        f"Z = {args.clip:g} (coordinate clipping)"
    )


def _plot(rows: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2), sharey=True)
    styles = {"paper": "-", "strict": "--"}
    colors = {"channel-only": "tab:red", "piggyback": "tab:blue",
              "piggyback-no-quantization": "tab:green"}
    for ax, channel, title in zip(
        axes, ("awgn", "rayleigh"), ("(b) AWGN", "(c) Rayleigh fading (mean ± std)"), strict=True
    ):
        for mode in ("paper", "strict"):
            for scheme in colors:
                pts = [r for r in rows if r["channel"] == channel and r["mode"] == mode
                       and r["scheme"] == scheme and math.isfinite(r["eps_mean"])]
                label = f"{scheme} ({mode})"
                if not pts:
                    ax.plot([], [], styles[mode], color=colors[scheme], label=label + ": inf")
                    continue
                x = [r["snr_db"] for r in pts]
                y = [r["eps_mean"] for r in pts]
                if channel == "rayleigh":
                    ax.errorbar(x, y, yerr=[r["eps_std"] for r in pts], fmt=styles[mode],
                                color=colors[scheme], capsize=2, label=label)
                else:
                    ax.plot(x, y, styles[mode], color=colors[scheme], marker=".", label=label)
        ax.set_yscale("log")
        ax.set_xlabel("receive SNR per symbol (dB)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    l = max(1, round(0.1 * args.d)) if args.l is None else args.l
    title = curve_title(args, l)
    fig.suptitle(title, fontsize=9)
    axes[0].set_ylabel(f"device-level epsilon (delta = {args.delta:g}, K = {args.rounds})")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Title": title.replace("\n", " ")})
    plt.close(fig)
    return path
