"""The aircomp planner: the closed form against a brute-force search over ``c``, and a run
that follows a plan (``testbed plan --scheme aircomp --out``, ``testbed run --plan``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aggregator.solver.aircomp_plan import largest_receiver_noise, plan_aircomp
from tests.test_aircomp_run import SETS, N, make_idx_dataset


def _acc(r: float, z: float, n: int, k: int, tau: float) -> float:
    return n * max(0.0, z - tau * r) / k + r


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize(("n", "k"), [(10, 10), (10, 7), (4, 1)])
def test_largest_receiver_noise_is_the_feasible_boundary(tau: float, n: int, k: int) -> None:
    """Independent check on a fine grid: every r up to the closed form meets the accuracy
    constraint, and a little beyond it does not."""
    z, eta = 2e-5, 0.1
    r = largest_receiver_noise(z, n, k, tau, eta)
    cap = (1 + eta) * n * z / k
    grid = np.linspace(0.0, r, 2001)
    assert all(_acc(float(x), z, n, k, tau) <= cap * (1 + 1e-9) for x in grid)
    assert _acc(r * 1.001 + 1e-15, z, n, k, tau) > cap


def _brute(gains, n0, p_max, z, col, tau, eta, ps, joules):  # type: ignore[no-untyped-def]
    """Minimum energy over a fine grid of c under the constraints, computed directly."""
    n, k = len(gains), len(gains) - col
    best = (math.inf, None)
    for c in np.geomspace(1e-3, 1e3, 40001):
        r = (n0 / 2) / c**2
        sigma = math.sqrt(max(0.0, z - tau * r) / k)
        if _acc(r, z, n, k, tau) > (1 + eta) * n * z / k * (1 + 1e-9):
            continue
        if any(c > g * math.sqrt(p / ps(sigma)) for g, p in zip(gains, p_max, strict=True)):
            continue
        e = sum((c / g) ** 2 * ps(sigma) for g in gains) * joules
        if e < best[0]:
            best = (e, c)
    return best


@pytest.mark.parametrize(("tau", "eta"), [(0.0, 0.1), (1.0, 0.1), (0.5, 0.05), (0.0, 0.0)])
def test_the_plan_is_the_brute_force_minimum(tau: float, eta: float) -> None:
    gains = [1.0, 0.8, 0.5, 0.9]
    n0, z, col, joules = 1e-4, 4e-6, 1, 0.02

    def ps(sigma: float) -> float:
        return 5e-4 + 2 * sigma**2

    plan = plan_aircomp(gains=gains, n0=n0, p_max=[1.0] * 4, z_var=z, colluding=col, tau=tau,
                        eta=eta, signal_power=ps, joules_per_unit_power=joules)
    if eta == 0 and tau == 0:  # no receiver noise allowed: nothing is feasible but full power
        assert plan.amplitude == pytest.approx(plan.reach)
        assert "power limits bind" in " ".join(plan.notes)
        return
    energy, c = _brute(gains, n0, [1.0] * 4, z, col, tau, eta, ps, joules)
    assert plan.energy_per_round_j == pytest.approx(energy, rel=2e-3)
    assert plan.amplitude == pytest.approx(c, rel=2e-3)
    assert plan.amplitude <= plan.reach * (1 + 1e-12)
    # privacy: every device's own share plus the credited others and receiver meet Z
    k = 4 - col
    assert k * plan.sigma**2 + tau * plan.receiver_noise_var >= z * (1 - 1e-9)
    assert plan.energy_per_round_j <= plan.full_power_energy_round_j * (1 + 1e-9)


def test_a_run_follows_the_plan(tmp_path: Path) -> None:
    """Plan a small aircomp config (receiver noise not credited: the devices keep their
    shares, the receiver may add a tenth more noise), then run with --plan: every slot at the
    planned fraction of the full-power amplitude, the shares as planned, every device within
    its target, less radio energy than the same run without the plan."""
    data = make_idx_dataset(tmp_path / "data", n_train=2000, n_test=200)
    sets = [*SETS, f"data_dir={data}", "privacy.trusted_channel_noise=0"]
    args = [a for s in sets for a in ("--set", s)]
    tb = [sys.executable, "-m", "testbed"]
    out = subprocess.run([*tb, "plan", *args, "--out", str(tmp_path / "plan.yaml"), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    assert plan["format"] == "dpfl-aircomp-plan/1" and 0 < plan["amplitude_ratio"] < 1
    assert plan["sigma"] == pytest.approx(plan["full_power_sigma"])  # nothing credited
    runs = {}
    for name, extra in (("planned", ["--plan", str(tmp_path / "plan.yaml")]), ("full", [])):
        done = subprocess.run([*tb, "run", *args, *extra, "--out", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[name] = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl")
                      .read_text().splitlines()]
    for planned, full in zip(runs["planned"], runs["full"], strict=True):
        assert planned["aircomp"]["amplitude"] == pytest.approx(
            plan["amplitude_ratio"] * full["aircomp"]["amplitude"], rel=1e-6)
        e_planned = sum(d["energy_comm_j"] for d in planned["devices"] if d.get("transmitted"))
        e_full = sum(d["energy_comm_j"] for d in full["devices"] if d.get("transmitted"))
        assert e_planned < e_full
    summary = json.loads((tmp_path / "planned" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert all(d["epsilon"] <= 2.0 for d in summary["privacy"]["devices"])
    events = [json.loads(x) for x in (tmp_path / "planned" / "ledger.jsonl").read_text()
              .splitlines()]
    assert {e["sigma"] for e in events if e.get("type") == "record-aircomp/v1"} == {
        plan["sigma"]}
    assert len(events) >= N
