"""One definition of a run's outcome: status, reason, exit code, lost uploads, console line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import testbed.local_devices as local_devices_module
from aggregator.outcome import OUTCOMES, exit_code
from edge_device.trainer import LocalResult, LocalTrainer
from radio.link import LinkError, LinkFailed
from testbed.cli.main import main
from testbed.core.config.loader import load_experiment
from testbed.core.privacy import Ledger
from testbed.runner import run_experiment


class _FlakyLink:
    """Wraps a real link; raises a chosen link error at chosen (device, round) uploads."""

    def __init__(self, inner: Any, fail: dict[tuple[int, int], type[LinkError]]) -> None:
        self.inner = inner
        self.fail = fail

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> _FlakyLink:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)

    def transmit(self, *, device: int, round_index: int, symbols: Any, rng: Any) -> Any:
        error = self.fail.get((device, round_index))
        if error is not None:
            raise error(f"injected: device {device} round {round_index}")
        return self.inner.transmit(device=device, round_index=round_index, symbols=symbols, rng=rng)


def _with_link_faults(monkeypatch: pytest.MonkeyPatch, fail: dict) -> None:
    real = local_devices_module.make_link
    monkeypatch.setattr(local_devices_module, "make_link",
                        lambda *a, **k: _FlakyLink(real(*a, **k), fail))


def _cli_run(tmp_path: Path, overrides: list[str], capsys: pytest.CaptureFixture[str]) -> tuple:
    args = ["run", "--no-progress", "--out", str(tmp_path / "run")]
    for o in overrides:
        args += ["--set", o]
    code = main(args)
    out = capsys.readouterr()
    summary_path = tmp_path / "run" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return code, summary, out.out + out.err


def test_completed_exits_zero_with_one_outcome_line(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary, text = _cli_run(tmp_path, tiny_overrides, capsys)
    assert code == 0 and summary["status"] == "completed" and summary["exit_code"] == 0
    assert summary["reason"] == "" and summary["lost_uploads"] == 0
    assert text.count("run completed: 3/3 rounds") == 1


def test_budget_exhausted_at_round_zero_is_not_success(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [
        *tiny_overrides,
        "privacy.unit=device",
        "scheme=ldp-fedavg",
        "privacy.sigma=0.01",
        "privacy.epsilon=1",
    ]
    code, summary, text = _cli_run(tmp_path, overrides, capsys)
    assert summary["status"] == "budget_exhausted" and summary["rounds_completed"] == 0
    assert code == 3 and "epsilon target 1.0" in summary["reason"]
    assert "run budget_exhausted: 0/3 rounds" in text


def test_budget_exhausted_after_rounds_exits_zero_only_when_asked(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # sigma fixed so that 2 of the 3 planned uploads fit within the target
    base = [
        *tiny_overrides,
        "privacy.unit=device",
        "scheme=ldp-fedavg",
        "privacy.epsilon=200",
        "privacy.sigma=2",
    ]
    code, summary, _ = _cli_run(tmp_path / "a", base, capsys)
    assert summary["status"] == "budget_exhausted" and summary["rounds_completed"] >= 1
    assert code == 3
    code, summary, _ = _cli_run(tmp_path / "b", [*base, "privacy.stop_on_budget=true"], capsys)
    assert summary["status"] == "budget_exhausted" and code == 0


def test_diverged_run_exits_nonzero(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = LocalTrainer.train

    def explode(self: LocalTrainer, w: np.ndarray, **kw: Any) -> LocalResult:
        out = real(self, w, **kw)
        return LocalResult(out.weights, out.differential * np.nan, float("nan"))

    monkeypatch.setattr(LocalTrainer, "train", explode)
    summary = run_experiment(load_experiment(None, tiny_overrides), tmp_path / "run")
    assert summary["status"] == "diverged" and summary["exit_code"] == 4
    assert "non-finite" in summary["reason"]


def test_lost_uploads_are_counted_and_charged(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_link_faults(monkeypatch, {(1, 0): LinkError, (2, 2): LinkError, (1, 2): LinkError})
    cfg = load_experiment(
        None,
        [*tiny_overrides, "scheme=channel-dp", "privacy.epsilon=40", "privacy.noise_multiplier=20"],
    )
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["lost_uploads"] == 3 and summary["lost_uploads_per_device"] == [0, 2, 1, 0]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["lost_uploads"] for m in lines] == [1, 0, 2]
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == 12  # lost uploads still count for privacy ...
    lost = [e for e in events if (e.device, e.round) in {(1, 0), (2, 2), (1, 2)}]
    assert all(e.trusted_channel_noise == 0 for e in lost)  # ... with no channel credit


def test_dead_link_is_link_failed_at_once(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_link_faults(monkeypatch, {(2, 1): LinkFailed})
    cfg = load_experiment(None, [*tiny_overrides, "scheme=channel-dp", "privacy.epsilon=40"])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "link_failed" and summary["exit_code"] == 5
    assert "device 2 round 1" in summary["reason"]
    assert summary["rounds_completed"] == 1  # nothing after the failure was attempted
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        round1 = [e.device for e in ledger.events() if e.round == 1]
    assert round1 == [0, 1, 2]  # the failed attempt is charged; device 3 never transmitted


def test_unexpected_error_is_failed_with_a_traceback_file(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = LocalTrainer.train

    def flaky(self: LocalTrainer, w: np.ndarray, **kw: Any) -> LocalResult:
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("disk on fire")
        return real(self, w, **kw)

    monkeypatch.setattr(LocalTrainer, "train", flaky)
    summary = run_experiment(load_experiment(None, tiny_overrides), tmp_path / "run")
    assert summary["status"] == "failed" and summary["exit_code"] == 1
    assert summary["reason"] == "RuntimeError: disk on fire"
    assert "disk on fire" in (tmp_path / "run" / "error.log").read_text()


def test_failure_before_anything_went_on_air_leaves_no_directory(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def dead(*args: Any, **kwargs: Any) -> Any:
        raise LinkFailed("flowgraph 'channel_emulator' exited with code 1 at start-up")

    monkeypatch.setattr(local_devices_module, "make_link", dead)
    summary = run_experiment(load_experiment(None, tiny_overrides), tmp_path / "run")
    assert summary["status"] == "link_failed" and summary.get("run_dir_removed")
    assert not (tmp_path / "run").exists()


def test_every_outcome_has_an_exit_code() -> None:
    cfg = load_experiment(None, [])
    codes = {s: exit_code(s, 1, cfg) for s in OUTCOMES}
    assert codes["completed"] == 0
    assert all(code != 0 for s, code in codes.items() if s != "completed")
    assert len(set(codes.values())) == len(OUTCOMES)


def test_loss_targets_report_the_first_round_and_the_energy_to_reach_them(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(None, [*tiny_overrides, "loss_targets=[100.0, 1.0e-9]"])
    summary = run_experiment(cfg, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = lines[0]
    energy = sum(d["energy_comm_j"] + d["energy_comp_j"] for d in first["devices"])
    reached, never = summary["loss_targets"]
    assert reached == {
        "target": 100.0, "window": 5, "round": 0, "energy_j": pytest.approx(energy)
    }
    assert never == {"target": 1e-9, "window": 5, "round": None, "energy_j": None}


def test_record_on_a_link_without_iq_is_bad_input_before_any_work(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary, text = _cli_run(tmp_path, [*tiny_overrides, "record=true"], capsys)
    assert code == 2 and summary is None and not (tmp_path / "run").exists()
    assert "config key 'record'" in text and "waveform" in text


def test_round_with_every_upload_lost_leaves_the_model_and_goes_on(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """All four uploads of round 1 lost: the round commits with the model unchanged (it
    used to fail with "no differential to average"), every upload still charged."""
    _with_link_faults(monkeypatch, {(i, 1): LinkError for i in range(4)})
    cfg = load_experiment(
        None,
        [*tiny_overrides, "scheme=channel-dp", "privacy.epsilon=40", "privacy.noise_multiplier=20"],
    )
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["uploads"] for m in lines] == [4, 0, 4]
    assert [m["lost_uploads"] for m in lines] == [0, 4, 0]
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        assert len(ledger.events()) == 12
