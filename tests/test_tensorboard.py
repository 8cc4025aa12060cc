"""A run's TensorBoard event files (testbed/core/runs/tensorboard_log.py, written from
aggregator/run_rounds.py) and a sweep's HParams (testbed/sweep/board.py), read back with
TensorBoard's own readers: written as the run goes, the series the issue names, nothing
sensitive in them, one line and no files without the package."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")

from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: E402
from tensorboard.plugins.hparams import metadata as hp_metadata  # noqa: E402

from testbed.core.config.loader import load_experiment  # noqa: E402
from testbed.core.runs import tensorboard_log  # noqa: E402
from testbed.core.runs.tensorboard_log import (  # noqa: E402
    MISSING_NOTE,
    TB_DIR,
    RoundFigures,
    classify_cause,
)
from testbed.runner import run_experiment  # noqa: E402
from testbed.sweep.board import METRICS, write_sweep_hparams  # noqa: E402
from testbed.sweep.results import result_row  # noqa: E402
from tests.watch_helpers import read_events, scan_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = str(ROOT / "testbed" / "config" / "private-fedsgd.yaml")
def _tiny_private(data_dir: Path, *extra: str, rounds: int = 3) -> Any:
    return load_experiment(PRIVATE, [
        "dataset=mnist", "model=logreg", f"data_dir={data_dir}", "devices=4", f"rounds={rounds}",
        "local_steps=1", "batch_size=16", "lr=0.05", *extra,
    ])


def _accumulator(folder: Path) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(folder), size_guidance={
        ea.SCALARS: 0, ea.TENSORS: 0, ea.IMAGES: 0})
    acc.Reload()
    return acc


def _text(acc: ea.EventAccumulator, tag: str) -> str:
    return acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def test_a_run_writes_its_series_round_by_round(tmp_path: Path, tiny_idx_dir: Path) -> None:
    """Each round is in the event file once it is committed (read back from inside the
    run, after each round); at the end the settings, trust and outcome texts and the final
    figures agree with summary.json."""
    cfg = _tiny_private(tiny_idx_dir)
    run = tmp_path / "run"
    seen: list[int] = []

    def after_round(line: dict[str, Any]) -> None:
        acc = _accumulator(run / TB_DIR)
        seen.append(len(acc.Scalars("epsilon/device_00")))
        assert acc.Scalars("loss/train")[-1].step == line["round"]

    summary = run_experiment(cfg, run, on_round=after_round)
    assert summary["status"] == "completed"
    assert seen == [1, 2, 3]
    acc = _accumulator(run / TB_DIR)
    tags = set(acc.Tags()["scalars"])
    for i in range(4):
        assert {f"epsilon/device_{i:02d}", f"snr_db/device_{i:02d}",
                f"snr_db/device_{i:02d}_budget", f"n0/device_{i:02d}",
                f"energy_j/device_{i:02d}"} <= tags
    assert {"accuracy/subset", "accuracy/test", "loss/train", "epsilon/target", "epsilon/max",
            "uploads/received", "uploads/lost", "uploads/late", "uploads/refused",
            "energy_j/total", "round_time_s/round", "round_time_s/train"} <= tags
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    eps = [d["epsilon_pld"] for m in metrics for d in m["devices"] if d["device"] == 2]
    assert [e.value for e in acc.Scalars("epsilon/device_02")] == pytest.approx(eps, rel=1e-6)
    assert acc.Scalars("epsilon/target")[-1].value == pytest.approx(5.0)
    snr = [m["devices"][1]["snr_db"] for m in metrics]
    assert [e.value for e in acc.Scalars("snr_db/device_01")] == pytest.approx(snr, rel=1e-6)
    assert [e.value for e in acc.Scalars("uploads/received")] == [4.0, 4.0, 4.0]
    energy = sum(d["energy_comm_j"] + d["energy_comp_j"] for m in metrics for d in m["devices"]
                 if d["device"] == 3)
    assert acc.Scalars("energy_j/device_03")[-1].value == pytest.approx(energy, rel=1e-5)
    assert acc.Scalars("final/accuracy")[-1].value == pytest.approx(summary["final_accuracy"])
    assert "scheme **ldp-fedavg**" in _text(acc, "settings")
    assert "rounds: 3" in _text(acc, "settings")
    assert _text(acc, "trust") == summary["privacy"]["trust"]
    assert _text(acc, "outcome").startswith("**completed**")
    assert acc.Scalars("tensorboard/writing_s")[-1].value > 0


def test_a_resumed_run_continues_its_series(tmp_path: Path, tiny_idx_dir: Path) -> None:
    """Stopped after round 1 and resumed: every round once, the running energy continued
    from the rounds before the stop."""
    from testbed.runner import resume_experiment

    cfg = _tiny_private(tiny_idx_dir)
    run = tmp_path / "cut"

    def stop_after_round_1(line: dict[str, Any]) -> None:
        if line["round"] == 1:
            raise KeyboardInterrupt

    assert run_experiment(cfg, run, on_round=stop_after_round_1)["status"] == "interrupted"
    assert resume_experiment(run)["status"] == "completed"
    acc = _accumulator(run / TB_DIR)
    assert [e.step for e in acc.Scalars("loss/train")] == [0, 1, 2]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    total = sum(d["energy_comm_j"] + d["energy_comp_j"] for m in metrics for d in m["devices"])
    assert acc.Scalars("energy_j/total")[-1].value == pytest.approx(total, rel=1e-5)


def test_nothing_sensitive_in_the_event_files(
    tmp_path: Path, tiny_idx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tag is one of the known figures; every value is a number, an image under an
    image tag or a text under a text tag; no number is a coordinate of an update (raw or
    clipped), of a noise draw or of the model, and no text holds the run's secret. The run
    records its uploads (``record: true``), so the constellation image is written too."""
    import edge_device.noise_ahead as noise_ahead
    import edge_device.uplink as uplink
    import testbed.core.noise as noise

    drawn: list[np.ndarray] = []

    def keep(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            drawn.append(np.array(out, dtype=np.float64, copy=True).ravel())
            return out
        return wrapped

    def keep_update(fn: Any) -> Any:
        def wrapped(g: Any, **kwargs: Any) -> Any:
            drawn.append(np.array(g, dtype=np.float64, copy=True).ravel())
            return keep(fn)(g, **kwargs)
        return wrapped

    monkeypatch.setattr(noise, "gaussian", keep(noise.gaussian))
    monkeypatch.setattr(noise_ahead, "gaussian", keep(noise_ahead.gaussian))
    monkeypatch.setattr(uplink, "clip", keep_update(uplink.clip))
    cfg = _tiny_private(tiny_idx_dir, "link=waveform", "record=true", "workers=1")
    run = tmp_path / "run"
    assert run_experiment(cfg, run)["status"] == "completed"
    assert len(drawn) >= 3 * 4 * 2, "the updates and noise draws were not seen"
    model = np.load(run / "checkpoint.npz")
    for key in model.files:
        drawn.append(np.asarray(model[key], dtype=np.float64).ravel())
    secrets = np.concatenate(drawn)
    secrets = secrets[np.isfinite(secrets) & (secrets != np.round(secrets))]
    private32 = set(secrets.astype(np.float32).tolist())
    run_secret = (run / "run_secret").read_text().strip()
    assert len(run_secret) >= 16

    numbers, images = scan_events(run / TB_DIR, [run_secret])
    assert images == {"radio/received_constellation": 2}  # the first and the last round
    assert numbers
    # An event holds a float32: with ~10^5 private values and hundreds of figures, a figure
    # can round to the float32 of a private value by chance. Such a match is a figure of the
    # run's own files (metrics.jsonl, summary.json) whose float64 is no private value; a leak
    # is not (the float64s of the private values, exactly).
    private64 = set(secrets.tolist())
    figures: dict[float, list[float]] = {}

    def collect(obj: Any) -> None:
        if isinstance(obj, dict):
            for v in obj.values():
                collect(v)
        elif isinstance(obj, list):
            for v in obj:
                collect(v)
        elif isinstance(obj, float) and math.isfinite(obj):
            figures.setdefault(float(np.float32(obj)), []).append(obj)

    for text in [*(run / "metrics.jsonl").read_text().splitlines(),
                 (run / "summary.json").read_text()]:
        collect(json.loads(text))
    leaked = [x for x in numbers if float(np.float32(x)) in private32
              and not any(m not in private64 for m in figures.get(float(np.float32(x)), []))]
    assert not leaked, f"event values equal to update, noise or model values: {leaked[:5]}"


def test_without_the_package_one_line_and_no_files(
    tmp_path: Path, tiny_idx_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``tensorboard`` not importable: the run completes, says so in one line, and writes no
    event files; the sweep's HParams likewise."""
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert not tensorboard_log.tensorboard_available()
    run = tmp_path / "run"
    assert run_experiment(_tiny_private(tiny_idx_dir, rounds=1), run)["status"] == "completed"
    assert not (run / TB_DIR).exists()
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if "tensorboard" in ln] == [MISSING_NOTE], err
    notes: list[str] = []
    row = result_row([("seed", 0)], run, json.loads((run / "summary.json").read_text()),
                     action="ran")
    assert write_sweep_hparams([row], ["seed"], tmp_path, notes.append) == 0
    assert notes == [MISSING_NOTE]
    assert not (run / TB_DIR).exists() and not (tmp_path / TB_DIR).exists()


def test_switched_off_writes_nothing(
    tmp_path: Path, tiny_idx_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``TESTBED_TENSORBOARD=0`` (the benchmark's baseline): no files, no note."""
    monkeypatch.setenv("TESTBED_TENSORBOARD", "0")
    run = tmp_path / "run"
    assert run_experiment(_tiny_private(tiny_idx_dir, rounds=1), run)["status"] == "completed"
    assert not (run / TB_DIR).exists()
    assert "tensorboard" not in capsys.readouterr().err


def test_sweep_cells_become_hparams_sessions(tmp_path: Path, tiny_idx_dir: Path) -> None:
    """Two cells' rows (as the sweep builds them from summary.json) become two HParams
    sessions with their grid value and final accuracy, epsilon and energy; a second write
    replaces the first."""
    rows = []
    for eps in (2.0, 8.0):
        run = tmp_path / "runs" / f"privacy.epsilon={eps:g}"
        summary = run_experiment(_tiny_private(tiny_idx_dir, f"privacy.epsilon={eps}",
                                               rounds=1), run)
        rows.append(result_row([("privacy.epsilon", eps)], run, summary, action="ran"))
    notes: list[str] = []
    for _ in range(2):
        assert write_sweep_hparams(rows, ["privacy.epsilon"], tmp_path, notes.append) == 2
    assert notes == []
    for row in rows:
        run = Path(row["run_dir"])
        hparams_files = list((run / TB_DIR).glob("*.hparams"))
        assert len(hparams_files) == 1
        starts = [hp_metadata.parse_session_start_info_plugin_data(
                      v.metadata.plugin_data.content)
                  for e in read_events(run / TB_DIR) for v in e.summary.value
                  if v.tag == hp_metadata.SESSION_START_INFO_TAG]
        assert len(starts) == 1
        assert starts[0].hparams["privacy.epsilon"].number_value == row["privacy.epsilon"]
        acc = _accumulator(hparams_files[0].parent)
        for tag, column, _ in METRICS:
            assert acc.Scalars(tag)[-1].value == pytest.approx(row[column], rel=1e-6), tag
    assert rows[0]["epsilon_max"] <= 2.0 < rows[1]["epsilon_max"] <= 8.0
    experiment = [v for e in read_events(tmp_path / TB_DIR) for v in e.summary.value
                  if v.tag == hp_metadata.EXPERIMENT_TAG]
    assert len(experiment) == 1


def test_round_figures_count_causes_and_skip_non_finite() -> None:
    """Lost, late and refused uploads by cause (running counts); an infinite SNR (a
    noise-free link) and devices past the per-device limit get no series of their own."""
    figures = RoundFigures(70, epsilon_key="epsilon_pld", epsilon_target=3.0)
    devices: list[dict[str, Any]] = [
        {"device": 0, "transmitted": True, "snr_db": float("inf"), "epsilon_pld": 1.0},
        {"device": 1, "transmitted": True, "lost": True, "error": "collision: device 2's"},
        {"device": 2, "transmitted": None, "straggler": True},
        {"device": 3, "transmitted": False, "refused": "its epsilon target 3 reached"},
        {"device": 69, "transmitted": True, "snr_db": 12.0, "epsilon_pld": 2.5},
    ]
    line: dict[str, Any] = {"round": 0, "train_loss": 1.0, "wall_s": {"round": 0.5},
                            "devices": devices}
    out = figures.scalars(line)
    assert "snr_db/device_00" not in out and "snr_db/device_69" not in out
    assert out["snr_db/min"] == 12.0 and out["epsilon/max"] == 2.5
    assert out["uploads/lost"] == out["uploads/late"] == out["uploads/refused"] == 1.0
    assert out["uploads_cause/lost_collision"] == 1.0
    assert out["uploads_cause/late_no_answer"] == 1.0
    assert out["uploads_cause/refused_budget"] == 1.0
    again = figures.scalars({**line, "round": 1, "devices": devices[1:2]})
    assert again["uploads_cause/lost_collision"] == 2.0
    assert again["uploads_cause/refused_budget"] == 1.0  # a running count, kept
    # an estimated channel's N0 and its lower bound (what the channel credit rests on)
    est = figures.scalars({**line, "round": 2, "devices": [
        {"device": 4, "transmitted": True, "snr_db": 20.0, "noise_var": 0.0099,
         "noise_var_lower": 0.0045}]})
    assert est["n0/device_04"] == 0.0099 and est["n0_lower/device_04"] == 0.0045
    assert classify_cause("burst reported late by the USRP") == "late_burst"
    assert classify_cause("receiver gap at 12.3 s") == "receiver_gap"
    assert classify_cause("something else") == "other"
