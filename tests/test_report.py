"""``testbed report``: report.md and figures of real tiny runs, complete, interrupted, killed."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from testbed.cli.main import main
from testbed.core.config.loader import load_experiment
from testbed.core.runs.rundir import read_jsonl
from testbed.report import write_report
from testbed.report.tables import check_report
from testbed.runner import run_experiment

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN_FILES = ("metrics.jsonl", "ledger.jsonl", "summary.json", "config.yaml", "checkpoint.npz")


def _tiny(idx: Path) -> list[str]:
    return [f"--set={kv}" for kv in (
        "dataset=mnist", "model=logreg", f"data_dir={idx}", "devices=4", "rounds=3",
        "batch_size=16", "lr=0.05",
    )]


@pytest.fixture(scope="module")
def runs(tiny_idx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real tiny runs made by `testbed run`: record-unit DP over Rayleigh fading,
    device-unit DP, and fedavg with loss targets."""
    root = tmp_path_factory.mktemp("report_runs")
    variants = {
        "record": ["scheme=ldp-fedavg", "privacy.unit=record", "local_steps=1",
                   "privacy.accountant=rdp", "fading=rayleigh", "snr_db=15", "eval_every=2"],
        "device": ["scheme=ldp-fedavg", "privacy.unit=device", "local_steps=3"],
        "fedavg": ["local_steps=3", "loss_targets=[100.0,0.001]", "loss_target_window=1"],
    }
    out = {}
    for name, sets in variants.items():
        path = root / name
        args = ["run", "--no-progress", *_tiny(tiny_idx_dir), *(f"--set={s}" for s in sets),
                "--out", str(path)]
        assert main(args) == 0, name
        out[name] = path
    return out


def _fresh_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report", "report.md", ".lock"))
    return dst


def _digests(path: Path) -> dict[str, str]:
    return {f: hashlib.sha256((path / f).read_bytes()).hexdigest()
            for f in RUN_FILES if (path / f).exists()}


def _table_rows(report: str, first_header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header starts with ``first_header``."""
    lines = report.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split(" | ")])
    return rows


def _header(report: str, first_header: str) -> list[str]:
    line = next(ln for ln in report.splitlines() if ln.startswith(f"| {first_header} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def _assert_png(path: Path) -> None:
    """A complete PNG of a plausible size with more than one colour in it."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert 500 <= width <= 3000 and 300 <= height <= 2000, (path, width, height)
    assert 10_000 < len(data) < 2_000_000, (path, len(data))
    assert data.rstrip(b"\0").endswith(b"IEND\xaeB`\x82"), f"{path} is truncated"
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert float(np.std(pixels[..., :3])) > 0.05, f"{path} is blank"


def _close(shown: str, value: float) -> bool:
    """Whether a table's text ``shown`` is ``value`` to the 4 significant digits shown."""
    return abs(float(shown) - value) <= 5e-4 * max(abs(value), 1e-12)


def test_record_unit_report(runs: dict[str, Path], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    run = _fresh_copy(runs["record"], tmp_path / "record")
    before = _digests(run)
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.md")
    assert _digests(run) == before, "writing a report changed the run's own files"
    report = (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert "| status | completed |" in report
    assert "Partial report" not in report
    # Per-device epsilon: the summary's, under both accountants, with unit/delta/accountant.
    header = _header(report, "device | uploads")
    assert header[2] == "ε rdp (enforced)" and "ε pld" in header
    rows = _table_rows(report, "device | uploads")
    devices = summary["privacy"]["devices"]
    assert len(rows) == len(devices) == 4
    last = read_jsonl(run / "metrics.jsonl")[-1]["devices"]
    for row, dev, m in zip(rows, devices, last, strict=True):
        assert int(row[0]) == dev["device"] and int(row[1]) == dev["uploads"] == 3
        assert _close(row[2], dev["epsilon_rdp"]) and _close(row[2], m["epsilon_rdp"])
        assert _close(row[header.index("ε pld")], dev["epsilon_pld"])
        assert dev["epsilon_rdp"] <= summary["privacy"]["epsilon_target"]
    assert "| unit | record |" in report and "| delta | 1e-05 |" in report
    assert "| enforced accountant | rdp |" in report
    assert f"| trust assumption | {summary['privacy']['trust']} |" in report
    # What was credited (ldp-fedavg credits no channel noise), not only what was configured.
    channel = summary["privacy"]["channel_noise"]
    assert channel["credited_fraction"] == 0 and channel["reason"]
    assert "| channel-noise fraction credited | 0 | summary.json: privacy.channel_noise." \
        "credited_fraction |" in report
    assert f"| why none credited | {channel['reason']} |" in report
    # Energy: the summary's per-device totals and the computing-energy source.
    energy = _table_rows(report, "device | computing (J)")
    for i, row in enumerate(energy[:4]):
        assert _close(row[1], summary["energy_comp_j_per_device"][i])
        assert _close(row[2], summary["energy_comm_j_per_device"][i])
    assert f"Computing energy: {summary['energy_comp_source']}." in report
    # Figures: all four, linked, valid; SNR varies under Rayleigh fading.
    for name in ("accuracy_loss.png", "epsilon.png", "energy.png", "snr.png"):
        assert f"(report/{name})" in report
        _assert_png(run / "report" / name)
    snr = _table_rows(report, "device | uploads with SNR")
    assert all(float(r[3]) < float(r[4]) for r in snr), "Rayleigh fading: min < max SNR"
    assert check_report(run) == []
    assert not list((run / "report").glob(".*.tmp")) and not list(run.glob(".*.tmp"))


def test_every_table_number_is_traced_to_the_run(runs: dict[str, Path], tmp_path: Path) -> None:
    run = _fresh_copy(runs["record"], tmp_path / "record")
    write_report(run)
    sources = json.loads((run / "report" / "sources.json").read_text())
    traced = [c for t in sources["tables"] for r in t["rows"] for c in r if "op" in c]
    assert len(traced) > 50
    assert {r["file"] for c in traced for r in c["refs"]} >= {
        "summary.json", "metrics.jsonl", "config.yaml"}
    assert check_report(run) == []
    # The check fails when the run directory disagrees with the report.
    summary = json.loads((run / "summary.json").read_text())
    summary["privacy"]["devices"][1]["epsilon_rdp"] += 0.5
    (run / "summary.json").write_text(json.dumps(summary))
    problems = check_report(run)
    # The device's own cell, and the across-device mean, spread and max that include it.
    assert problems[0].startswith("epsilon: shows"), problems
    assert sorted(p.split(":")[0] for p in problems[1:]) == ["epsilon_spread"] * 3, problems


def test_device_unit_reports_paper_and_strict(runs: dict[str, Path], tmp_path: Path) -> None:
    run = _fresh_copy(runs["device"], tmp_path / "device")
    report = write_report(run).read_text()
    summary = json.loads((run / "summary.json").read_text())
    header = _header(report, "device | uploads")
    assert header[2] == "ε strict (enforced)"
    assert "ε paper (003 Thm 1, not a DP bound)" in header
    paper = header.index("ε paper (003 Thm 1, not a DP bound)")
    for row, dev in zip(_table_rows(report, "device | uploads"), summary["privacy"]["devices"],
                        strict=True):
        assert _close(row[2], dev["epsilon_strict"]) and _close(row[paper], dev["epsilon_paper"])
    assert "| unit | device |" in report
    _assert_png(run / "report" / "epsilon.png")
    assert check_report(run) == []


def test_fedavg_report_loss_targets_and_no_privacy(runs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    run = _fresh_copy(runs["fedavg"], tmp_path / "fedavg")
    report = write_report(run).read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert "No differential privacy" in report
    assert not (run / "report" / "epsilon.png").exists() and "epsilon.png" not in report
    targets = _table_rows(report, "target train loss")
    assert len(targets) == 2
    reached, never = summary["loss_targets"]
    assert reached["round"] is not None and never["round"] is None
    assert targets[0][2] == str(reached["round"]) and _close(targets[0][3], reached["energy_j"])
    assert targets[1][2] == "n/a" and targets[1][3] == "n/a"
    assert f"| final test accuracy | {summary['final_accuracy']:.4g} |" in report
    for name in ("accuracy_loss.png", "energy.png", "snr.png"):
        _assert_png(run / "report" / name)
    assert check_report(run) == []
    # The settings say what was done: the config asks for sparsification and quantization,
    # but fedavg sends every coordinate unquantized (the summary's per-device l and levels).
    assert all(dev["l"] == summary["d"] and dev["levels"] is None
               for dev in summary["privacy"]["devices"])
    settings = {r[0]: r[1] for r in _table_rows(report, "setting")}
    assert settings["sparsify (applied)"] == "no: every device sent all d coordinates (l = d)"
    assert settings["coordinates sent l (every device)"] == str(summary["d"])
    assert settings["sparsify (config, not applied: scheme fedavg does not sparsify)"] == "yes"
    assert settings["kept fraction theta_s (config, not applied: scheme fedavg does not "
                    "sparsify)"] == "0.1"
    assert settings["quantize (applied)"] == "no: no quantizer on any upload"
    assert settings["quantization levels Q (config, not applied: scheme fedavg does not "
                    "quantize)"] == "16"
    assert "sparsify" not in settings and "kept fraction theta_s" not in settings


def test_settings_show_the_compression_applied(runs: dict[str, Path], tmp_path: Path) -> None:
    """Where the uplinks sparsified and quantized, the settings say so with the summary's
    l and Q (here written into a copy of the fedavg run's summary)."""
    run = _fresh_copy(runs["fedavg"], tmp_path / "compressed")
    summary = json.loads((run / "summary.json").read_text())
    for dev in summary["privacy"]["devices"]:
        dev["l"], dev["levels"] = 785 + dev["device"], 16
    (run / "summary.json").write_text(json.dumps(summary))
    report = write_report(run).read_text()
    settings = {r[0]: r[1] for r in _table_rows(report, "setting")}
    assert settings["sparsify (applied)"] == "yes" and settings["quantize (applied)"] == "yes"
    assert settings["coordinates sent l (smallest over devices)"] == "785"
    assert settings["quantization levels Q (every device)"] == "16"
    assert settings["kept fraction theta_s (config)"] == "0.1"
    assert check_report(run) == []
    # Without a summary (a killed run) the rows are the config's, marked as such.
    (run / "summary.json").unlink()
    report = write_report(run).read_text()
    assert "| sparsify (configured; no summary says what was applied) | yes |" in report


def test_killed_run_gives_a_partial_report(runs: dict[str, Path], tmp_path: Path) -> None:
    """No summary (killed with SIGKILL) and a torn last metrics line."""
    run = _fresh_copy(runs["record"], tmp_path / "killed")
    (run / "summary.json").unlink()
    metrics = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(metrics[:-40])  # the last round's line torn
    assert main(["report", str(run)]) == 0
    report = (run / "report.md").read_text()
    assert "Partial report" in report and "no summary.json" in report
    assert "its last line is torn" in report
    assert "| status | unknown: summary.json missing or unreadable |" in report
    assert "| rounds committed | 2 |" in report
    committed = read_jsonl(run / "metrics.jsonl")
    assert len(committed) == 2
    rows = _table_rows(report, "device | uploads")
    for row, m in zip(rows, committed[-1]["devices"], strict=True):
        assert int(row[1]) == 2 and _close(row[2], m["epsilon_rdp"])
    _assert_png(run / "report" / "epsilon.png")
    assert check_report(run) == []


def test_interrupted_run_report_says_so(tiny_overrides: list[str], tmp_path: Path) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "rounds=4", "scheme=ldp-fedavg",
                                 "privacy.unit=device"])

    def stop_after_round_1(line: dict) -> None:
        if line["round"] == 1:
            raise KeyboardInterrupt

    summary = run_experiment(cfg, tmp_path / "cut", on_round=stop_after_round_1)
    assert summary["status"] == "interrupted"
    report = write_report(tmp_path / "cut").read_text()
    assert "| status | interrupted |" in report
    assert f"| reason | {summary['reason']} |" in report
    assert "| rounds completed | 2 |" in report and "| rounds planned | 4 |" in report
    assert check_report(tmp_path / "cut") == []


def test_a_failing_figure_is_named_not_fatal(runs: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.report.plots as plots

    def broken(run: object) -> None:
        raise RuntimeError("no figure today")

    run = _fresh_copy(runs["fedavg"], tmp_path / "fedavg")
    write_report(run)
    assert (run / "report" / "energy.png").exists()
    monkeypatch.setattr(plots, "PLOTTERS", (plots.accuracy_loss_plot, broken))
    report = write_report(run).read_text()
    assert "could not be drawn: RuntimeError: no figure today" in report
    assert not (run / "report" / "energy.png").exists(), "a stale figure stayed linked"
    assert "energy.png" not in report
    _assert_png(run / "report" / "accuracy_loss.png")


@pytest.mark.parametrize("make", ["missing", "file", "empty", "launch"])
def test_not_a_run_directory_is_exit_2(make: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x"
    if make == "file":
        target.write_text("hello")
    elif make == "empty":
        target.mkdir()
    elif make == "launch":
        (target / "aggregator").mkdir(parents=True)
        (target / "aggregator" / "config.yaml").write_text("name: x\n")
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    expected = {"missing": "does not exist", "file": "is a file, not a run directory",
                "empty": "is not a run directory", "launch": "its run directory is"}[make]
    assert err.startswith("testbed report: error:") and expected in err, err
    assert "Traceback" not in err
    if make == "empty":
        assert list(target.iterdir()) == [], "nothing is written into a non-run directory"


def test_corrupt_files_are_reported_not_fatal(runs: dict[str, Path], tmp_path: Path) -> None:
    run = _fresh_copy(runs["device"], tmp_path / "corrupt")
    (run / "summary.json").write_text('{"status": "compl')
    (run / "config.yaml").write_text("rounds: [unclosed\n")
    report = write_report(run).read_text()
    assert re.search(r"summary\.json is unreadable", report)
    assert re.search(r"config\.yaml is unreadable", report)
    assert "| rounds committed | 3 |" in report
    assert "| unit | device (" in report, "the ledger header still tells the privacy unit"
    assert check_report(run) == []


def test_many_devices_are_drawn_as_outlines_and_bands(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``MAX_DEVICE_MARKS`` devices (here 2, so that the 4-device Rayleigh run is
    'many') the energy bars are one filled outline per series and the SNR boxes quartile
    bands: the figures are drawn and valid, with a handful of artists instead of one (or
    six) per device."""
    from matplotlib.figure import Figure

    from testbed.report import plots

    monkeypatch.setattr(plots, "MAX_DEVICE_MARKS", 2)
    run = _fresh_copy(runs["record"], tmp_path / "run")
    write_report(run)
    for name in ("energy.png", "snr.png"):
        _assert_png(run / "report" / name)
    ax = Figure().add_subplot()
    heights = np.array([1.0, np.nan, 3.0, 2.0])
    plots._bars(ax, heights, np.zeros(4), color="tab:blue", label="x")
    assert len(ax.patches) == 1 and not ax.containers  # one outline, not four bars
    ax = Figure().add_subplot()
    plots._quartile_bands(ax, [np.arange(5.0), np.array([2.0]), np.arange(9.0)], [0, 1, 2])
    assert len(ax.collections) == 2 and len(ax.lines) == 1
    monkeypatch.setattr(plots, "MAX_DEVICE_MARKS", 60)
    ax = Figure().add_subplot()
    plots._bars(ax, heights, np.zeros(4), color="tab:blue", label="x")
    assert len(ax.patches) == 4
