"""`testbed reproduce`: every number in the report's tables traces to a file it names."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.reproduce.figures import fading_below_awgn

TESTBED = [sys.executable, "-m", "testbed"]


def _tables(md: str, first_header: str) -> list[dict[str, str]]:
    """Rows of the markdown table whose header starts with ``first_header``."""
    lines = md.splitlines()
    for n, line in enumerate(lines):
        if line.startswith(f"| {first_header} |"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[n + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(header, [c.strip() for c in row.strip("|").split("|")],
                                     strict=True)))
            return rows
    raise AssertionError(f"no table starting with {first_header!r}")


def _close(text: str, value: float | None) -> bool:
    if value is None:
        return text == "-"
    if text == "inf":
        return math.isinf(value)
    return math.isclose(float(text), value, rel_tol=1e-3, abs_tol=1e-12)


def _quick_table1(out: Path, *schemes: str) -> list[str]:
    """``testbed reproduce table1 --quick`` of ``schemes`` at epsilon 5, two rounds."""
    return [*TESTBED, "reproduce", "table1", "--quick", "--schemes", *schemes,
            "--epsilons", "5", "--set", "rounds=2", "--set", "eval_samples=300",
            "--set", "eval_every=2", "--out", str(out)]


@pytest.mark.slow  # 36 s; fig2bc and fig3 stay in the default selection
def test_table1_numbers_come_from_the_run_dirs_they_name(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    cmd = _quick_table1(out, "ldp-fedavg", "channel-dp")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "report.md").read_text()
    rows = _tables(md, "data set")
    assert [r["scheme"] for r in rows] == ["ldp-fedavg", "channel-dp"]
    for r in rows:
        summary = json.loads((out / r["run dir"] / "summary.json").read_text())
        devs = summary["privacy"]["devices"]
        assert _close(r["measured accuracy (%)"], 100 * summary["final_accuracy"])
        assert r["rounds"] == str(summary["rounds_completed"])
        assert _close(r["record epsilon (enforced)"], max(d["epsilon"] for d in devs))
        assert _close(r["device-level epsilon"], max(d["epsilon_device_level"] for d in devs))
        assert _close(r["epsilon, no channel credit"],
                      max(d["epsilon_no_channel"] for d in devs))
        assert r["accountant"] == summary["privacy"]["enforced_accounting"]
        assert _close(r["delta"], summary["privacy"]["delta"])
        assert r["status"] == summary["status"] == "completed"
        # printed values are the paper's (Table I at eps 5), quoted, not measured
        assert r["printed MNIST (%)"] == {"ldp-fedavg": "91.12", "channel-dp": "91.12"}[
            r["scheme"]]
    assert "Quick mode" in md and "not a reproduction" in md
    with open(out / "table1.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 2
    assert (out / "table1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # run again: the finished cells are skipped, not re-run
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/**/summary.json")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/**/summary.json")} == before
    assert "2 of its 2 runs were finished by an earlier invocation" in (
        out / "report.md").read_text()


def test_fig2bc_verdicts_follow_the_curve_csv(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    proc = subprocess.run([*TESTBED, "reproduce", "fig2b", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "report.md").read_text()
    with open(out / "fig2bc" / "privacy_curve.csv", newline="") as fh:
        rows = [{**r, "snr_db": float(r["snr_db"]), "eps_mean": float(r["eps_mean"])}
                for r in csv.DictReader(fh)]
    table = _tables(md, "channel")
    assert len(table) == 4
    for t in table:
        sel = {r["snr_db"]: r["eps_mean"] for r in rows if r["channel"] == t["channel"]
               and r["mode"] == t["accounting"] and r["scheme"] == "piggyback"}
        ref = {r["snr_db"]: r["eps_mean"] for r in rows if r["channel"] == t["channel"]
               and r["mode"] == t["accounting"] and r["scheme"] == "channel-only"}
        below = all(sel[s] < ref[s] for s in ref)
        assert t["piggyback below channel only at every SNR"] == str(below)
        if t["channel"] == "rayleigh":
            f = fading_below_awgn(rows, t["accounting"], "piggyback")
            assert t["Rayleigh mean below AWGN at every SNR (piggyback)"] == (
                "-" if f is None else str(f))
    assert (out / "fig2bc" / "privacy_curve.png").is_file()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["table1", "--data", "mnist=/nonexistent/dir"], "--data mnist"),
        (["table1", "--data", "imagenet=/tmp"], "unknown data set 'imagenet'"),
        (["table1", "--calibration", "mnist=/etc/hostname"], "--calibration"),
        (["table1", "--epsilons", "-1"], "--epsilons"),
        (["table1", "--set", "nosuchkey=1", "--quick"], "nosuchkey"),
    ],
)
def test_bad_input_is_refused_before_any_work(tmp_path: Path, args: list[str],
                                              needle: str) -> None:
    out = tmp_path / "rep"
    proc = subprocess.run([*TESTBED, "reproduce", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr
    assert not (out / "runs").exists()


def test_dp_pasgd_round_is_charged_its_four_local_steps_of_computing() -> None:
    """003 counts computing energy per global round; a dp-pasgd round is tau local steps of
    the base config's one-step round, so Fig. 3 must not credit it with a quarter of that."""
    from testbed.core.config.loader import load_experiment
    from testbed.reproduce.cases import BASE_CONFIG, PASGD_TAU, settings, table1_cases

    step = load_experiment(BASE_CONFIG).energy.e_comp_j
    assert load_experiment(BASE_CONFIG).local_steps == 1
    for extra, per_step in ((None, step), ({"energy.e_comp_j": 0.3}, 0.3)):
        cases = {c.scheme: c for c in table1_cases(settings(False, extra))}
        pasgd = cases["dp-pasgd"].overrides
        assert pasgd["local_steps"] == PASGD_TAU == 4
        assert pasgd["energy.e_comp_j"] == pytest.approx(4 * per_step)
        assert pasgd["rounds"] == 160 // 4
        assert all("energy.e_comp_j" not in c.overrides for s, c in cases.items()
                   if s != "dp-pasgd")


def test_fig3_rows_and_verdicts_follow_the_run_summaries(tmp_path: Path) -> None:
    """Fig. 3's energies, rounds and ratios are the summaries'; a scheme that missed the
    target gets no ratio (EE-DP-FL included), and the verdict names who missed it."""
    from testbed.reproduce.runs import RunCell
    from testbed.reproduce.sections import fig3_section

    def cell(scheme: str, eps: float, hit_round: int | None, energy: float | None) -> RunCell:
        run_dir = tmp_path / "runs" / scheme / f"eps{eps:g}"
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "status": "completed", "rounds_completed": 160, "final_train_loss": 0.75,
            "energy_comp_source": "modelled (configured e_comp_j)",
            "loss_targets": [{"target": 0.7, "window": 5, "round": hit_round,
                              "energy_j": energy}],
        }))
        return RunCell("fashion-mnist", scheme, eps, {"status": "completed"}, run_dir)

    cells = [cell("ldp-fedavg", 5, 145, 731.6), cell("channel-dp", 5, 138, 696.5),
             cell("s-dp-fl", 5, None, None), cell("ee-dp-fl", 5, 60, 300.0),
             cell("ldp-fedavg", 1.8, 150, 750.0), cell("channel-dp", 1.8, None, None),
             cell("s-dp-fl", 1.8, None, None), cell("ee-dp-fl", 1.8, None, None)]
    md = fig3_section(cells, tmp_path, 0.7)
    rows = {(r["epsilon target"], r["scheme"]): r for r in _tables(md, "data set")}
    assert _close(rows[("5", "ldp-fedavg")]["ratio to EE-DP-FL"], 731.6 / 300.0)
    assert rows[("5", "ee-dp-fl")]["ratio to EE-DP-FL"] == "1"
    assert rows[("5", "s-dp-fl")]["ratio to EE-DP-FL"] == "-"
    assert rows[("1.8", "ee-dp-fl")]["ratio to EE-DP-FL"] == "-"
    assert rows[("1.8", "ldp-fedavg")]["ratio to EE-DP-FL"] == "-"
    assert rows[("5", "channel-dp")]["round reached"] == "138"
    assert ("eps 5: every peer that reached it needs 1.5x-2.5x EE-DP-FL's energy "
            "(ldp-fedavg 2.44x, channel-dp 2.32x), as printed. s-dp-fl did not reach") in md
    assert "eps 1.8: not comparable: did not reach the target loss 0.7: channel-dp" in md
    assert "ee-dp-fl (final train loss 0.75 after 160 rounds)" in md
    with open(tmp_path / "fig3.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 8


@pytest.mark.slow
def test_sigterm_while_planning_stops_cleanly_and_leaves_no_planner(tmp_path: Path) -> None:
    """SIGTERM to `testbed reproduce` (as a job scheduler sends) while `testbed plan` runs as
    its child: exit 130, the child is killed with it, no half-written plan is left."""
    import os
    import signal
    import time

    from tests.test_sweep import _nothing_in_session, _wait_gone

    out = tmp_path / "rep"
    proc = subprocess.Popen(
        [*TESTBED, "reproduce", "fig2a", "--quick", "--epsilons", "5", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    scenario = out / "plans" / "fashion-mnist-eps5.scenario.yaml"
    deadline = time.monotonic() + 60
    while not scenario.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    time.sleep(2.0)  # the planner child is solving (about 25 s)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    _wait_gone(lambda: _nothing_in_session(proc.pid))
    assert not (out / "plans" / "fashion-mnist-eps5.yaml").exists()
    assert not (out / "plans" / "fashion-mnist-eps5.json").exists()


@pytest.mark.slow  # 35 s; the statement code is the same for every run length
def test_aircomp_is_reported_beside_the_tdma_schemes(tmp_path: Path) -> None:
    """Table I's aircomp row and its statement: accuracy beside ldp-fedavg's at the same
    epsilon, the air time of one slot against the TDMA slots, the radio energy per round."""
    out = tmp_path / "rep"
    cmd = _quick_table1(out, "ldp-fedavg", "aircomp")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "report.md").read_text()
    rows = _tables(md, "data set")
    assert [r["scheme"] for r in rows] == ["ldp-fedavg", "aircomp"]
    air = next(r for r in rows if r["scheme"] == "aircomp")
    metrics = [json.loads(x) for x in (out / air["run dir"] / "metrics.jsonl").read_text()
               .splitlines()]
    slot = metrics[0]["aircomp"]["airtime_s"]
    line = next(x for x in md.splitlines() if "aircomp (every device in one slot" in x)
    assert "against ldp-fedavg" in line and f"air time per round {slot:.4g} s" in line
    assert "(ldp-fedavg:" in line and "bench_central_dpsgd.py" in line
