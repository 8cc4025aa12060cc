"""Fig. 2(a), 2(b)/(c) and 3 of 003 from plans, run directories and ``privacy-curve``.

Every measured value carries the file it was read from, so the report can name it.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.core.config.errors import ConfigError
from testbed.reproduce.printed import FIG3_RATIO_RANGE
from testbed.sweep.cells import read_summary


@dataclass(frozen=True)
class Sourced:
    """A number and the file it came from (``None`` value: not available, with why)."""

    value: float | None
    source: str
    why: str = ""


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v


def measured_noise(run_dir: Path) -> dict[str, Sourced]:
    """Mean artificial noise of a finished run, from its summary's per-device privacy.

    ``sigma`` is the std per coordinate of the noise added to the upload (0 for schemes
    that add their noise at each local step); ``noise_multiplier`` is the per-record noise
    multiplier the run enforced (artificial and credited channel noise together).
    """
    src = str(run_dir / "summary.json")
    s = read_summary(run_dir)
    devs = ((s or {}).get("privacy") or {}).get("devices") or []
    if not devs:
        why = "no summary" if s is None else "no per-device privacy in the summary"
        return {"sigma": Sourced(None, src, why), "noise_multiplier": Sourced(None, src, why)}
    sig = [_num(d.get("sigma")) for d in devs]
    z = [_num(d.get("noise_multiplier")) for d in devs]
    out = {}
    for name, vals in (("sigma", sig), ("noise_multiplier", z)):
        ok = [v for v in vals if v is not None]
        out[name] = Sourced(sum(ok) / len(ok) if ok else None, src)
    return out


def energy_to_target(run_dir: Path) -> Sourced:
    """Energy (J, every device, computing + radio) up to the first round at which the run's
    5-round mean training loss met its first ``loss_targets`` entry (``None``: never)."""
    src = str(run_dir / "summary.json")
    s = read_summary(run_dir)
    if s is None:
        return Sourced(None, src, "no summary")
    hits = s.get("loss_targets") or []
    if not hits:
        return Sourced(None, src, "the run recorded no loss target")
    hit = hits[0]
    if hit.get("round") is None:
        return Sourced(None, src, f"target {hit.get('target')} not reached")
    return Sourced(_num(hit.get("energy_j")), src)


def fig3_ratios(energies: dict[str, Sourced]) -> dict[str, float | None]:
    """Peer energy / EE-DP-FL energy per 003 peer (``None`` where either is missing)."""
    ee = energies.get("ee-dp-fl")
    out: dict[str, float | None] = {}
    for scheme, e in energies.items():
        if scheme == "ee-dp-fl":
            continue
        ok = ee is not None and ee.value and e.value is not None
        out[scheme] = (e.value / ee.value) if ok else None  # type: ignore[operator,union-attr]
    return out


def fig3_holds(ratios: dict[str, float | None]) -> bool | None:
    """Does every available ratio fall in 003's printed 1.5x-2.5x? ``None``: none available."""
    vals = [r for r in ratios.values() if r is not None]
    if not vals:
        return None
    lo, hi = FIG3_RATIO_RANGE
    return all(lo <= r <= hi for r in vals)


def privacy_curve(out_dir: Path, rounds: int, realizations: int) -> dict[str, Any]:
    """Run ``testbed privacy-curve`` (Fig. 2(b)/(c)) into ``out_dir``; its JSON summary
    plus the rows of its CSV (``rows``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "testbed", "privacy-curve", "--out", str(out_dir),
           "--rounds", str(rounds), "--realizations", str(realizations), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ConfigError(f"testbed privacy-curve exited {proc.returncode}: {' / '.join(tail)}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    with open(result["csv"], newline="") as fh:
        rows = [
            {**r, "snr_db": float(r["snr_db"]), "eps_mean": float(r["eps_mean"]),
             "eps_std": float(r["eps_std"])}
            for r in csv.DictReader(fh)
        ]
    result["rows"] = rows
    return result


def fading_below_awgn(rows: list[dict[str, Any]], mode: str, scheme: str) -> bool | None:
    """Fig. 2(c)'s second claim: is the Rayleigh mean epsilon below AWGN's at every SNR
    where both are finite? ``None`` when no SNR has both finite."""
    awgn = {r["snr_db"]: r["eps_mean"] for r in rows
            if r["channel"] == "awgn" and r["mode"] == mode and r["scheme"] == scheme}
    ray = {r["snr_db"]: r["eps_mean"] for r in rows
           if r["channel"] == "rayleigh" and r["mode"] == mode and r["scheme"] == scheme}
    both = [s for s in awgn if s in ray and math.isfinite(awgn[s]) and math.isfinite(ray[s])]
    if not both:
        return None
    return all(ray[s] < awgn[s] for s in both)
