"""The emulation fallback end to end: the lab's own hardware configs, no USRP attached.

Copies of ``hw_configs/lab_ota.yaml`` and ``darkroom.yaml`` with every address on the
loopback (UHD asks 127.0.0.x and finds nothing; no discovery leaves the host). With
``--fallback emulate`` the same processes run on virtual USRPs with the configs' parameters
and say so everywhere; without it the run still ends ``link_failed`` naming the device args.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.core.config.emulated import EMULATED_LABEL
from testbed.core.config.loader import load_hardware
from testbed.core.config.safe_yaml import dump_yaml_text
from tests.lab_helpers import (
    RECORD_CONFIG,
    RECORD_SETS,
    assert_ledgers_agree,
    assert_pilot_snr_is_the_budget_through_the_fade,
    edge_cmd,
    free_port,
    new_lab,
    processes_mentioning,
    sets,
    tb_cmd,
)
from tests.radio_helpers import require_gnuradio
from tests.test_radio_fallback import bench_copy

ROOT = Path(__file__).resolve().parents[1]
#: The issue's command: the shipped record-level job for two rounds.
FEDSGD = str(ROOT / "testbed" / "config" / "private-fedsgd.yaml")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)


def test_run_on_the_lab_config_without_usrps_falls_back_and_says_so(tmp_path: Path) -> None:
    """``testbed run private-fedsgd.yaml --hw COPY --fallback emulate --set rounds=2``: every
    upload is a burst of the emulated transmitter through the virtual air; the outcome line,
    summary.json, meta.json, the saved hardware config and the report's title say
    "emulated radios (no USRP found)"."""
    require_gnuradio()
    copy = bench_copy(tmp_path, "lab_ota")
    out = tmp_path / "run"
    res = _run("run", FEDSGD, "--hw", str(copy), "--fallback", "emulate", "--set", "rounds=2",
               "--out", str(out), "--no-progress")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(f"run completed on {EMULATED_LABEL}: 2/2 rounds"), res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["radios"] == EMULATED_LABEL and summary["link"] == "usrp"
    assert "virtual air" in summary["privacy"]["channel_noise"]["source"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["radios"]["label"] == EMULATED_LABEL
    assert meta["radios"]["not_found"] == ["usrp.tx_args = 'addr=127.0.0.2'",
                                           "usrp.rx_args = 'addr=127.0.0.3'"]
    assert meta["radios"]["fading"] == "none" and meta["radios"]["doppler_hz"] == 0.0
    saved = load_hardware(str(out / "hw_config.yaml"))  # what a resume runs on
    assert saved.virtual and saved.usrp.emulated is not None
    assert (out / "report.md").read_text().splitlines()[0] == (
        f"# Run report: private-fedsgd, on {EMULATED_LABEL}")
    metrics = _lines(out / "metrics.jsonl")
    uploads = [d for line in metrics for d in line["devices"] if d.get("transmitted")]
    assert len(uploads) == 20 and not any(d.get("lost") for d in uploads)
    bursts = [b for b in _lines(out / "air" / "air.jsonl") if "serial" in b]
    assert len(bursts) == 20 and {b["serial"] for b in bursts} == {"tx0"}
    budgets = [e["mean_snr_db"] for e in meta["radios"]["paths"] if e["serial"] == "tx0"]
    assert budgets == [20.0]  # the experiment's snr_db is the emulated link budget
    for d, burst in zip(uploads, bursts, strict=True):  # in order, one burst per upload
        # The payload's SNR at the upload's own power, against the burst's (its preamble
        # and pilots at unit power lift the burst's mean a little above the payload's).
        assert -1.5 < d["snr_db"] - burst["budget_snr_db"] < 0.5, (d, burst)
    assert not processes_mentioning(str(out))


def test_without_the_fallback_a_missing_usrp_still_fails_the_link(tmp_path: Path) -> None:
    copy = bench_copy(tmp_path, "lab_ota")
    res = _run("run", FEDSGD, "--hw", str(copy), "--set", "rounds=2", "--out",
               str(tmp_path / "run"), "--no-progress")
    assert res.returncode == 5, res.stdout + res.stderr
    assert res.stdout.startswith("run link_failed on USRPs: 0/2 rounds"), res.stdout
    assert "no USRP found for the transmitter ('addr=127.0.0.2')" in res.stdout
    assert "--fallback emulate" in res.stdout
    assert "emulated" not in res.stdout.split("(")[0]
    assert not (tmp_path / "run").exists()  # nothing went on air


def test_launch_writes_the_emulated_config_every_process_reads(tmp_path: Path) -> None:
    """``testbed launch --hw COPY --fallback emulate``: the launcher asks UHD for the
    receiver's and each edge's USRP, finds none, and writes OUT/hw.yaml on emulated radios
    (its air on free loopback ports, as for a virtual lab)."""
    from testbed.core.config.loader import load_experiment
    from testbed.lab.launch import _resolved_hw

    copy = bench_copy(tmp_path, "lab_ota")
    cfg = load_experiment(RECORD_CONFIG, [*RECORD_SETS, "devices=2", f"hw_config={copy}"])
    path, virtual = _resolved_hw(tmp_path, str(copy), [], fallback="emulate", cfg=cfg,
                                 devices=2)
    hw = load_hardware(str(path))
    assert virtual and hw.usrp.emulated is not None
    assert hw.usrp.emulated.missing == ["usrp.rx_args = 'addr=127.0.0.3'",
                                        "usrp.devices[0].tx_args = 'addr=127.0.0.11'",
                                        "usrp.devices[1].tx_args = 'addr=127.0.0.12'"]
    assert hw.virtual_air.burst_address != "tcp://127.0.0.1:5600"  # free ports
    (tmp_path / "plain").mkdir()
    path, virtual = _resolved_hw(tmp_path / "plain", str(copy), [], fallback=None, cfg=cfg,
                                 devices=2)
    assert not virtual and load_hardware(str(path)).usrp.emulated is None


def _darkroom_copy(tmp_path: Path) -> Path:
    """The darkroom copy with its (future) virtual air on free loopback ports."""
    copy = bench_copy(tmp_path, "darkroom")
    data = load_hardware(str(copy)).model_dump(mode="json")
    data["virtual_air"]["burst_address"] = f"tcp://127.0.0.1:{free_port()}"
    data["virtual_air"]["stream_address"] = f"tcp://127.0.0.1:{free_port()}"
    copy.write_text(dump_yaml_text(data))
    return copy


@pytest.mark.slow  # reason: 55 s of a whole darkroom lab; the lab config's fallback runs by default
@pytest.mark.parametrize("name", ["darkroom"])
def test_darkroom_lab_falls_back_to_its_rayleigh_channel(tmp_path: Path, name: str) -> None:
    """The bench's processes, each started on its own with ``--fallback emulate``: the
    aggregator finds no receiver, runs on emulated radios and starts their air (Rayleigh
    at 20 km/h: fD 17 Hz, in meta.json); each edge finds no USRP and transmits on its
    emulated one into that air. The SNR varies over the uploads as the fading does: each
    frame's pilot SNR is the link budget through the fade the air applied to it."""
    require_gnuradio()
    copy = _darkroom_copy(tmp_path)
    keys, endpoint, procs = new_lab(tmp_path, 4)
    run = tmp_path / "agg"
    try:
        agg = procs.start("agg", tb_cmd(
            "aggregator", RECORD_CONFIG, "--bind", endpoint, "--keys", str(keys), "--out",
            str(run), "--round-timeout", "120", "--join-timeout", "180", "--no-progress",
            "--fallback", "emulate",
            *sets([*RECORD_SETS, "devices=4", "rounds=2", "train_samples=8000",
                   "privacy.trusted_channel_noise=1", f"hw_config={copy}"])))
        edges = [procs.start(f"edge-{i}", edge_cmd(keys, endpoint, tmp_path, i, "--hw",
                                                   str(copy), "--fallback", "emulate"))
                 for i in range(4)]
        assert agg.wait(400) == 0, procs.log("agg")[-3000:]
        for i, e in enumerate(edges):
            assert e.wait(60) == 0, procs.log(f"edge-{i}")[-2000:]
    finally:
        procs.close()
    assert f"run completed on {EMULATED_LABEL}" in procs.log("agg")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["radios"]["fading"] == "rayleigh" and meta["radios"]["speed_kmh"] == 20.0
    assert meta["radios"]["doppler_hz"] == pytest.approx(16.956, abs=1e-3)
    assert json.loads((run / "summary.json").read_text())["radios"] == EMULATED_LABEL
    assert "emulated radios (no USRP found)" in (run / "report.md").read_text().splitlines()[0]
    bursts = [b for b in _lines(run / "air" / "air.jsonl") if "serial" in b]
    uploads = [d for line in _lines(run / "metrics.jsonl") for d in line["devices"]
               if d.get("transmitted")]
    assert len(uploads) >= 6  # of 8 (an edge that misses its slot on a loaded host refuses)
    snrs = assert_pilot_snr_is_the_budget_through_the_fade(uploads, bursts)
    # Rayleigh at 17 Hz, seconds apart: the fade of a 55 ms burst spans less than 3 dB over
    # 8 uploads in 0.55 % of runs (simulated), less than 1 dB in none of 20,000
    assert max(snrs) - min(snrs) > 1.0, snrs
    assert_ledgers_agree(run, {i: tmp_path / f"edge-{i}" for i in range(4)})
    for marker in (str(run), str(copy)):
        assert not processes_mentioning(marker), marker
