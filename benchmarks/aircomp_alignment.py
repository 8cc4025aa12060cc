#!/usr/bin/env python3
"""What a fading channel does to over-the-air aggregation's alignment within one burst.

A device pre-equalizes with its gain at a pilot, ``alpha = c / h(t_p)``; later in the burst
its contribution arrives as ``c h(t) / h(t_p)``. The aggregation error it leaves (per unit
of its values' power) is ``|h(t) / h(t_p) - 1|^2``, averaged over the burst. This script
draws Clarke/Jakes Rayleigh fading (:func:`radio.fading.clarke_gains`) at the Doppler of
``--speed-kmh`` at ``--carrier-hz`` and reports that error for a pilot at the start of the
burst only, and for pilots refreshed every ``--refresh-ms``; a device whose gain at a pilot
is below ``--truncate`` (``|h|^2``) sits that stretch out (truncated inversion), without
which the mean is unbounded. An analysis script, not a benchmark (docs/aircomp.md).

Usage::

    .venv/bin/python benchmarks/aircomp_alignment.py [--burst-ms 55] [--speed-kmh 20]
        [--realizations 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from radio.fading import clarke_gains, doppler_hz


def misalignment(gains: np.ndarray, every: int, truncate: float) -> np.ndarray:
    """Per realisation and pilot stretch, the mean ``|h / h_pilot - 1|^2`` over the stretch
    (stretches whose pilot gain is below ``truncate`` left out); ``gains`` ``(R, n)``."""
    out = []
    n = gains.shape[1]
    for s0 in range(0, n, every):
        ref = gains[:, s0]
        ok = np.abs(ref) ** 2 >= truncate
        seg = gains[ok, s0:s0 + every]
        out.append(np.mean(np.abs(seg / ref[ok, None] - 1.0) ** 2, axis=1))
    return np.concatenate(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--burst-ms", type=float, default=55.0)
    p.add_argument("--speed-kmh", type=float, default=20.0)
    p.add_argument("--carrier-hz", type=float, default=915e6)
    p.add_argument("--symbol-rate-hz", type=float, default=200e3)
    p.add_argument("--realizations", type=int, default=3000)
    p.add_argument("--truncate", type=float, default=0.1)
    p.add_argument("--refresh-ms", type=float, nargs="*", default=[20, 10, 5, 2.5, 1])
    p.add_argument("--seed", type=int, default=1, help="the channel draws (not privacy noise)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fd = doppler_hz(args.speed_kmh, args.carrier_hz)
    n = int(args.burst_ms * 1e-3 * args.symbol_rate_hz)
    times = np.arange(n) / args.symbol_rate_hz
    rng = np.random.default_rng(args.seed)
    gains = np.stack([clarke_gains(times, fd, rng) for _ in range(args.realizations)])
    rows = []
    for refresh in [None, *args.refresh_ms]:
        every = n if refresh is None else max(1, int(refresh * 1e-3 * args.symbol_rate_hz))
        e = misalignment(gains, every, args.truncate)
        rows.append({"refresh_ms": refresh, "mean_db": 10 * math.log10(float(np.mean(e))),
                     "median_db": 10 * math.log10(float(np.median(e)))})
    if args.json:
        print(json.dumps({"doppler_hz": fd, "coherence_ms": 423.0 / fd, "rows": rows}))
        return 0
    print(f"fD = {fd:.2f} Hz, coherence time 0.423 / fD = {423.0 / fd:.1f} ms; "
          f"burst {args.burst_ms:g} ms, {args.realizations} Rayleigh draws, truncation "
          f"|h|^2 >= {args.truncate:g}")
    for r in rows:
        what = "pilot at the start only" if r["refresh_ms"] is None else \
            f"pilot every {r['refresh_ms']:g} ms"
        print(f"  {what:>24}: mean {r['mean_db']:6.1f} dB, median {r['median_db']:6.1f} dB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
