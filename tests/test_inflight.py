"""Kept uploads (``RUN/inflight/``) as a group commit: written without an fsync each, made
durable by one fsync per batch; a record torn by a crash before its group fsync is dropped,
a corrupt record in the fsynced part is refused; a kill between the writes and the group
fsync is resumed with the kept uploads reused, nothing charged twice, the model unchanged."""

from __future__ import annotations

import json
import os
import signal
import stat
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from testbed.core.config.loader import load_experiment
from testbed.core.privacy import Ledger
from testbed.core.runs import inflight
from testbed.core.runs.rundir import RunDir, RunDirError, dumps, read_jsonl
from testbed.runner import run_experiment
from tests.test_crash_safety import _cli, _run_args


def _upload(i: int, d: int = 5) -> tuple[np.ndarray, dict[str, object]]:
    vec = np.random.default_rng(i).standard_normal(d)
    return vec, {"device": i, "transmitted": True, "snr_db": float("inf"), "loss": 0.1 * i}


def _segment(rd: RunDir, t: int, k: int = 0) -> Path:
    return rd.inflight_path / f"r{t}-s{k}.kept"


def test_kept_uploads_round_trip_bit_for_bit(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    for i in range(3):
        rd.keep_upload(2, i, *_upload(i))
    rd.keep_upload(2, 7, None, {"device": 7, "lost": True})
    rd.sync_kept()
    loaded = rd.load_inflight(2)
    assert sorted(loaded) == [0, 1, 2, 7]
    for i in range(3):
        vec, info = _upload(i)
        assert loaded[i][0] is not None and loaded[i][0].dtype == np.float64
        assert loaded[i][0].tobytes() == vec.tobytes()
        assert loaded[i][1] == {**info, "snr_db": "inf"}  # strict JSON, as the metrics
    assert loaded[7] == (None, {"device": 7, "lost": True})
    assert rd.load_inflight(1) == {} and rd.load_inflight(3) == {}
    rd.close()


def test_one_fsync_per_batch_not_per_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    calls: list[int] = []  # fsyncs of files (the directories' are made once)
    real = os.fsync

    def counted(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    monkeypatch.setattr(inflight, "SYNC_UPLOADS", 4)
    rd = RunDir(tmp_path)
    for i in range(10):
        rd.keep_upload(0, i, *_upload(i))
    assert len(calls) == 2  # after the 4th and the 8th upload
    rd.sync_kept()
    rd.sync_kept()  # nothing written since: no fsync
    assert len(calls) == 3
    assert sorted(rd.load_inflight(0)) == list(range(10))
    rd.close()


def test_records_torn_before_the_group_fsync_are_dropped(tmp_path: Path) -> None:
    """A power cut loses (part of) what was written after the last group fsync: the complete
    records are reused, the torn one and everything after it are not."""
    rd = RunDir(tmp_path)
    for i in range(3):
        rd.keep_upload(0, i, *_upload(i))
    rd.sync_kept()
    for i in range(3, 6):
        rd.keep_upload(0, i, *_upload(i))
    rd.close()  # syncs: records 0-2, a sync mark, records 3-5, a sync mark
    seg = _segment(rd, 0)
    data = seg.read_bytes()
    sizes = [len(inflight.encode_record(1, 0, i, dumps(_upload(i)[1]).encode(), _upload(i)[0]))
             for i in range(6)]
    mark = len(inflight.encode_record(2, 0, 0, b"", None))
    ends = np.cumsum([*sizes[:3], mark, *sizes[3:], mark])
    assert ends[-1] == len(data)
    cuts = ((ends[6] + 7, 6), (ends[5] + 7, 5), (ends[5] - 1, 4), (ends[3], 3), (ends[2] + 1, 3))
    for cut, devices in cuts:
        seg.write_bytes(data[:cut])
        assert sorted(RunDir(tmp_path).load_inflight(0)) == list(range(devices))
    seg.write_bytes(data[: ends[3]] + b"\0" * (len(data) - ends[3]))  # zeros, as after a cut
    assert sorted(RunDir(tmp_path).load_inflight(0)) == [0, 1, 2]


def test_a_corrupt_record_in_the_fsynced_part_is_refused(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    for i in range(3):
        rd.keep_upload(4, i, *_upload(i))
    rd.sync_kept()
    rd.keep_upload(4, 3, *_upload(3))
    rd.close()
    seg = _segment(rd, 4)
    data = bytearray(seg.read_bytes())
    data[60] ^= 0x01  # inside the first record, which a later sync mark says is durable
    seg.write_bytes(bytes(data))
    with pytest.raises(RunDirError, match=r"r4-s0\.kept: kept upload at byte 0 is corrupt"
                       r" although it was fsynced") as info:
        RunDir(tmp_path).load_inflight(4)
    assert "\n" not in str(info.value)


def test_a_resumed_process_keeps_in_a_new_segment_and_both_are_read(tmp_path: Path) -> None:
    first = RunDir(tmp_path)
    first.keep_upload(1, 0, *_upload(0))
    first.keep_upload(1, 1, *_upload(1))
    first.close()
    second = RunDir(tmp_path)
    assert sorted(second.load_inflight(1)) == [0, 1]
    second.keep_upload(1, 2, *_upload(2))
    second.sync_kept()
    assert sorted(p.name for p in second.inflight_path.iterdir()) == ["r1-s0.kept",
                                                                      "r1-s1.kept"]
    assert sorted(second.load_inflight(1)) == [0, 1, 2]
    second.keep_upload(2, 0, *_upload(0))  # the next round: round 1's segment is closed
    second.clear_inflight_before(2)
    assert sorted(p.name for p in second.inflight_path.iterdir()) == ["r2-s0.kept"]
    second.clear_inflight_before(3)
    assert not second.inflight_path.exists()
    second.close()


def test_uploads_kept_one_file_each_by_an_earlier_version_are_read(tmp_path: Path) -> None:
    import io

    rd = RunDir(tmp_path)
    rd.keep_upload(0, 1, *_upload(1))
    rd.sync_kept()
    buf = io.BytesIO()
    np.savez(buf, info=np.frombuffer(b'{"device": 0}', dtype=np.uint8), decoded=np.ones(5))
    (rd.inflight_path / "r0-d0.npz").write_bytes(buf.getvalue())
    loaded = rd.load_inflight(0)
    assert sorted(loaded) == [0, 1] and loaded[0][1] == {"device": 0}
    rd.clear_inflight_before(1)
    assert not rd.inflight_path.exists()


# -- a kill between the writes and the group fsync, resumed -------------------------------

def _strip(lines: list[dict]) -> list[dict]:
    """Metrics lines without wall times and the resumed marks of reused uploads."""
    out = []
    for m in lines:
        m = {k: v for k, v in m.items() if k != "wall_s"}
        m["devices"] = [{k: v for k, v in d.items() if k != "resumed"} for d in m["devices"]]
        out.append(m)
    return out


def test_kill_before_the_group_fsync_resumes_with_the_kept_uploads(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """Killed after round 1's uploads were written to ``inflight/`` and before their group
    fsync: the resume reuses every one of them (none asked again) and ends with the model
    and metrics of a run never killed, bit for bit."""
    run = tmp_path / "run"
    proc = _cli(_run_args(run, tiny_overrides), {"TESTBED_FAULT": "before_inflight_sync:2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert sorted(RunDir(run).load_inflight(1)) == [0, 1, 2, 3]
    proc = _cli(["run", "--resume", str(run)])
    assert proc.returncode == 0, proc.stderr
    lines = RunDir(run).metrics()
    assert all(d.get("resumed") for d in lines[1]["devices"])  # reused, not asked again
    reference = tmp_path / "ref"
    run_experiment(load_experiment(None, tiny_overrides), reference)
    assert _strip(lines) == _strip(RunDir(reference).metrics())
    got, want = RunDir(run).load_checkpoint(), RunDir(reference).load_checkpoint()
    assert got is not None and want is not None
    assert got[1].tobytes() == want[1].tobytes()
    assert not (run / "inflight").exists()


def test_kill_before_the_group_fsync_charges_every_upload_once(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """The same kill in a private run: every upload that went on air is in the ledger once,
    and no device is charged twice for a round (its kept upload was reused)."""
    run, air = tmp_path / "run", tmp_path / "air.jsonl"
    env = {"TESTBED_AIR_LOG": str(air)}
    dp = [*tiny_overrides, "scheme=channel-dp", "privacy.epsilon=4.0", "snr_db=10"]
    proc = _cli(_run_args(run, dp), {**env, "TESTBED_FAULT": "before_inflight_sync:2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    proc = _cli(["run", "--resume", str(run)], env)
    assert proc.returncode == 0, proc.stderr
    with Ledger.open(run / "ledger.jsonl") as ledger:
        entries = ledger.entries()
    on_air = [line["nonce"] for line in read_jsonl(air)]
    assert sorted(e.nonce for e in entries) == sorted(on_air)  # on air, charged, once each
    per_upload = Counter((e.event.device, e.event.round) for e in entries)
    assert set(per_upload.values()) == {1} and len(per_upload) == 3 * 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3


def test_garbage_that_is_not_a_torn_record_is_refused(tmp_path: Path) -> None:
    """Bytes that neither start a record nor could be one torn by a crash (a prefix of the
    magic, or zeros a power cut may leave) are damage, named with safe advice."""
    rd = RunDir.create(tmp_path / "run")
    rd.inflight_path.mkdir()
    seg = rd.inflight_path / "r0-s0.kept"
    for torn in (b"", b"KE", b"KEPT\x01\x00", b"\0" * 64):
        seg.write_bytes(torn)
        assert rd.load_inflight(0) == {}
    seg.write_bytes(b"garbage\n")
    with pytest.raises(RunDirError, match="r0-s0.kept: byte 0 starts neither") as err:
        rd.load_inflight(0)
    assert "stay charged in the ledger and are lost for the round" in str(err.value)


@pytest.mark.parametrize("name", ["r1-s0.kept", "r1-d2.npz"])
def test_resume_refuses_a_damaged_kept_file_naming_it(
    tmp_path: Path, tiny_overrides: list[str], name: str
) -> None:
    """A garbage file in ``inflight/`` stops ``--resume`` before any work with exit 2 and
    one line naming it; its advice (remove it) charges nothing again: after removing it,
    the resumed run charges every (device, round) once."""
    run, air = tmp_path / "run", tmp_path / "air.jsonl"
    env = {"TESTBED_AIR_LOG": str(air)}
    dp = [*tiny_overrides, "scheme=channel-dp", "privacy.epsilon=4.0", "snr_db=10"]
    proc = _cli(_run_args(run, dp), {**env, "TESTBED_FAULT": "after_inflight:6"})  # round 1
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    for f in (run / "inflight").iterdir():
        f.unlink()
    (run / "inflight" / name).write_bytes(b"garbage\n")
    before = (run / "ledger.jsonl").read_bytes()
    proc = _cli(["run", "--resume", str(run)], env)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(lines) == 1 and name in lines[0] and "remove the file" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (run / "error.log").exists()
    assert (run / "ledger.jsonl").read_bytes() == before  # no work was done
    (run / "inflight" / name).unlink()
    proc = _cli(["run", "--resume", str(run)], env)
    assert proc.returncode == 0, proc.stderr
    with Ledger.open(run / "ledger.jsonl") as ledger:
        charged = Counter((e.device, e.round) for e in ledger.events())
    released = Counter((x["device"], x["round"]) for x in read_jsonl(air))
    assert set(charged.values()) == {1} and set(released.values()) == {1}
    assert len(charged) == 3 * 4


def test_strict_json_is_the_same_text_with_or_without_non_finite_floats() -> None:
    """``dumps`` writes an object as it is unless it holds a non-finite float: the same text
    as through ``json_safe`` either way."""
    from testbed.core.runs.rundir import json_safe

    finite = {"a": 1.5, "b": [1, 2.25, (3, "x")], "c": {"d": None, "e": True, 7: -0.0}}
    for value in (finite, {**finite, "f": float("inf")}, [float("nan"), {"g": -float("inf")}]):
        for kwargs in ({}, {"separators": (",", ":")}, {"indent": 2}):
            assert dumps(value, **kwargs) == json.dumps(json_safe(value), allow_nan=False,
                                                       **kwargs)
