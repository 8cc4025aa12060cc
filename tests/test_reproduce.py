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


def test_table1_numbers_come_from_the_run_dirs_they_name(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    proc = subprocess.run(
        [*TESTBED, "reproduce", "table1", "--quick", "--schemes", "ldp-fedavg", "channel-dp",
         "--epsilons", "5", "--set", "rounds=2", "--set", "eval_samples=300",
         "--set", "eval_every=2", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "report.md").read_text()
    rows = _tables(md, "data set")
    assert [r["scheme"] for r in rows] == ["ldp-fedavg", "channel-dp"]
    for r in rows:
        summary = json.loads((out / r["run dir"] / "summary.json").read_text())
        devs = summary["privacy"]["devices"]
        assert _close(r["measured accuracy (%)"], 100 * summary["final_accuracy"])
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
    proc = subprocess.run(
        [*TESTBED, "reproduce", "table1", "--quick", "--schemes", "ldp-fedavg", "channel-dp",
         "--epsilons", "5", "--set", "rounds=2", "--set", "eval_samples=300",
         "--set", "eval_every=2", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/**/summary.json")} == before


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
    from testbed.config.loader import load_experiment
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
