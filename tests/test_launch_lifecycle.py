"""``testbed launch`` from start to end: it fails fast when one of its processes does, says
where the report is, and ``testbed launch --resume OUT`` continues an interrupted launch;
``testbed run --resume`` refuses a lab run directory, naming the command that continues it.

The launches run as the user runs them (``python -m testbed launch ...``, its own process
group), so that SIGINT reaches the launcher alone, as Ctrl-C in a terminal does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.core.lab_checks import LAB_MARKER
from tests.lab_helpers import (
    RECORD_CONFIG,
    RECORD_SETS,
    ROOT,
    assert_ledgers_agree,
    processes_mentioning,
    sets,
    tb_cmd,
    wait_for,
)
from tests.radio_helpers import require_gnuradio
from tests.test_radio_fallback import bench_copy

#: A launch whose process fails ends within this many seconds. On a quiet 2-core host it
#: took 7.4-11.6 s (the issue asks for 15 s), most of it the processes' start-up; under a
#: load average of 3.5 up to 16 s, so the bound here is generous. Before fail-fast the
#: launch waited out the aggregator's join timeout (120 s and more).
FAIL_FAST_S = 60.0
#: Record-level channel-dp crediting the channel noise on the virtual lab, 3 rounds.
VIRTUAL_SETS = [*RECORD_SETS, "rounds=3", "privacy.trusted_channel_noise=1"]
#: The virtual lab tests' timing (tests/test_virtual_lab_faults.py): room for a loaded host.
TIMING = ["--train-allowance", "20", "--round-timeout", "120", "--join-timeout", "180"]


def _launch(*argv: str, timeout_s: float = 900) -> tuple[subprocess.CompletedProcess[str],
                                                          float]:
    """``testbed launch ARGV`` to its end; returns it and how long it took (s)."""
    t0 = time.monotonic()
    done = subprocess.run(tb_cmd("launch", *argv), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - t0


def _no_process_left(out: Path) -> None:
    """Nothing the launch started outlives it (a flowgraph's watchdog may take a moment)."""
    wait_for(lambda: not processes_mentioning(str(out)), 30, f"no process mentioning {out}")


# --- fail fast -------------------------------------------------------------------------------


def test_launch_without_its_usrps_ends_link_failed_with_the_edges_error(tmp_path: Path) -> None:
    """``testbed launch private-fedsgd.yaml --hw lab_ota.yaml --devices 2``, no USRP and no
    ``--fallback`` (a loopback copy of the config: UHD asks 127.0.0.x and finds nothing):
    each edge finds no USRP and exits link failed; the launch stops the aggregator (which
    would wait out its join timeout) and ends link failed (5) at once, printing the
    edge's error line and its log."""
    out = tmp_path / "lab"
    done, took = _launch(RECORD_CONFIG, "--hw", str(bench_copy(tmp_path, "lab_ota")),
                         "--devices", "2", "--out", str(out), timeout_s=300)
    text = done.stdout + done.stderr
    assert done.returncode == 5, text
    failed = [x for x in done.stderr.splitlines() if x.startswith("testbed launch: edge-")]
    assert len(failed) == 1, text
    line = failed[0]
    assert "exited with code 5 before the run ended" in line, line
    assert "link failed: device " in line and "no USRP found for usrp.devices[" in line, line
    device = int(line.split("edge-")[1].split()[0])
    assert f"(log: {out / 'logs' / f'edge-{device}.log'})" in line, line
    assert "summary.json is missing" not in text  # the edge said why; no run began
    assert took < FAIL_FAST_S, f"{took:.1f} s: {text}"
    assert not (out / "aggregator").exists()
    _no_process_left(out)


def test_launch_on_a_cuda_device_this_host_lacks_ends_with_the_aggregators_error(
    tmp_path: Path,
) -> None:
    """``--set compute.device=cuda`` on a CPU-only host: the aggregator refuses it (exit 2);
    the launch ends bad input (2) at once with the aggregator's error line and log, not
    only "no run outcome"."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: compute.device=cuda is valid here")
    out = tmp_path / "lab"
    done, took = _launch("--devices", "2", "--set", "compute.device=cuda", "--out", str(out),
                         timeout_s=300)
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    failed = [x for x in done.stderr.splitlines() if x.startswith("testbed launch: ")]
    assert len(failed) == 1, text
    assert failed[0].startswith("testbed launch: aggregator exited with code 2 before the run "
                                "ended: testbed: error: config key 'compute.device': got "
                                "'cuda'"), failed[0]
    assert failed[0].endswith(f"(log: {out / 'logs' / 'aggregator.log'})"), failed[0]
    assert took < FAIL_FAST_S, f"{took:.1f} s: {text}"
    _no_process_left(out)


# --- interrupted, then resumed -----------------------------------------------------------------


@pytest.mark.slow  # reason: a virtual-lab launch, interrupted and resumed (about 1 min)
def test_launch_interrupted_after_a_round_resumes_to_the_end_with_ledgers_agreeing(
    tmp_path: Path,
) -> None:
    """A virtual-lab launch (air, aggregator, 2 edges with their tx flowgraphs) gets SIGINT
    (Ctrl-C) once its first round is committed: it ends interrupted (130), says where the
    report is and how to continue. ``testbed launch --resume OUT`` starts a fresh air, the
    aggregator with ``--resume`` and the edges on their keys and state directories; the run
    completes, every edge's ledger equals the aggregator's, the report's path is printed.
    ``testbed run --resume OUT/aggregator`` then refuses (2), naming ``launch --resume``."""
    require_gnuradio()
    out = tmp_path / "lab"
    run = out / "aggregator"
    first_log = tmp_path / "first.log"
    with first_log.open("wb") as log:
        first = subprocess.Popen(
            tb_cmd("launch", RECORD_CONFIG, "--hw", str(ROOT / "hw_configs" / "virtual_lab.yaml"),
                   "--devices", "2", "--out", str(out), *TIMING, *sets(VIRTUAL_SETS)),
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        def one_round() -> bool:
            assert first.poll() is None, first_log.read_text()[-5000:]
            metrics = run / "metrics.jsonl"
            return metrics.exists() and len(metrics.read_text().splitlines()) >= 1

        wait_for(one_round, 600, "the first round")
        first.send_signal(signal.SIGINT)
        assert first.wait(120) == 130, first_log.read_text()[-5000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    text = first_log.read_text()
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted", text
    assert f"continue with:  testbed launch --resume {out}" in text, text
    assert f"report: {run / 'report.md'}" in text, text
    assert (run / "report.md").is_file()
    done_before = len((run / "metrics.jsonl").read_text().splitlines())
    assert 1 <= done_before < 3
    _no_process_left(out)

    again, _ = _launch("--resume", str(out), *TIMING)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text + "".join(
        p.read_text(errors="replace")[-3000:] for p in (out / "logs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3, summary
    assert again.stdout.startswith("run completed"), again.stdout
    assert f"report: {run / 'report.md'}" in again.stderr, again.stderr
    assert "continue with" not in text
    assert_ledgers_agree(run, {i: out / f"edge-{i}" for i in range(2)})
    # each process's log holds both launches, the second after a line that says so
    for name in ("aggregator", "air", "edge-0", "edge-1"):
        log = (out / "logs" / f"{name}.log").read_text()
        assert f"--- testbed launch: {name} started again at " in log, log[-3000:]
    assert (out / "logs" / "aggregator.log").read_text().count("all 2 devices joined") == 2
    _no_process_left(out)

    refused = subprocess.run(tb_cmd("run", "--resume", str(run)), cwd=ROOT, capture_output=True,
                             text=True, timeout=120, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"`testbed launch --resume {out}`" in refused.stderr, refused.stderr
    assert json.loads((run / "summary.json").read_text()) == summary  # nothing was done


# --- refusals ---------------------------------------------------------------------------------


def _lab_run_dir(path: Path) -> Path:
    """A directory with a lab run's marker (``lab.json``) and a run's files."""
    path.mkdir(parents=True)
    (path / LAB_MARKER).write_text('{"kind": "lab", "aggregator": "testbed aggregator"}\n')
    (path / "config.yaml").write_text("name: x\n")
    (path / "meta.json").write_text("{}\n")
    return path


def _launch_dir(path: Path) -> Path:
    """The layout of ``testbed launch --out PATH``: its run directory and keys."""
    _lab_run_dir(path / "aggregator")
    (path / "keys").mkdir()
    (path / "keys" / "aggregator.key").write_text("public\n")
    return path


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("launched", [True, False], ids=["launched", "aggregator"])
def test_run_resume_of_a_lab_run_directory_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], launched: bool,
) -> None:
    """``testbed run --resume`` of a lab run (``lab.json``) would train and draw the noise in
    this one process, off the edges: refused (2) in one line naming ``testbed launch
    --resume OUT`` when a launch wrote it, else ``testbed aggregator --resume``; the
    directory is left as it was."""
    if launched:
        out = _launch_dir(tmp_path / "lab")
        run = out / "aggregator"
        expected = f"`testbed launch --resume {out}`"
    else:
        run = _lab_run_dir(tmp_path / "run")
        expected = f"--resume {run}` and restart its `testbed edge` processes"
    before = _tree(tmp_path)
    assert main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"testbed run: error: --resume {run}: a lab run directory"), err
    assert expected in err, err
    assert _tree(tmp_path) == before
    if launched:  # the launch directory itself
        assert main(["run", "--resume", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "a `testbed launch` directory" in err and expected in err, err


def test_launch_resume_refuses_what_no_launch_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """``testbed launch --resume`` of a directory that is not a launch's: exit 2, one line
    saying what it is and what to do, before anything starts."""
    out = _launch_dir(tmp_path / "lab")
    plain = _lab_run_dir(tmp_path / "lab-run")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\n")
    (run / "meta.json").write_text("{}\n")
    never = tmp_path / "never"
    (never / "keys").mkdir(parents=True)
    (never / "keys" / "aggregator.key").write_text("public\n")
    cases = {
        out / "aggregator": f"the launch's run directory, not the launch's; give the launch "
                            f"directory: `testbed launch --resume {out}`",
        plain: "not written by `testbed launch`",
        run: f"a `testbed run` directory, not a launch's; continue it with "
             f"`testbed run --resume {run}`",
        never: "whose aggregator never started its run",
        tmp_path / "empty-not-there": "no such launch directory",
        tmp_path: "not a launch directory",
    }
    for path, expected in cases.items():
        assert main(["launch", "--resume", str(path)]) == 2, path
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith(f"testbed launch: error: --resume {path}: "), err
        assert expected in err, (path, err)
    assert not (out / "logs").exists()  # nothing started
    assert main(["launch", "--resume", str(out), "--devices", "2"]) == 2
    assert "--resume takes the launch's own config" in capsys.readouterr().err
