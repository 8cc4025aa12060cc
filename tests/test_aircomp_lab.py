"""Scheme ``aircomp`` in the virtual radio lab: the real aggregator, edge, flowgraph and air
processes with a shared PPS and 10 MHz (``hw_configs/virtual_lab_aircomp.yaml``).

Per round every device sends its pilot alone, then all four send their frames into one slot
and the air adds them; the aggregator decodes the sum without ever seeing a device's values
and measures the slot's aggregation error on the public probes. Checked: the process tree's
work (pilots in their own slots, the four data bursts at one instant, superposed), the
probe NMSE against the symbol link's at the same SNRs, the distributed-DP ledger on both
sides, every device within its target, and that nothing is left running.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.lab.launch import launch
from testbed.runner import run_experiment
from tests.lab_helpers import assert_ledgers_agree, processes_mentioning
from tests.radio_helpers import require_gnuradio

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "testbed" / "config" / "aircomp-fedsgd.yaml")
HW = str(ROOT / "hw_configs" / "virtual_lab_aircomp.yaml")
#: 4 devices, 2 rounds; the pilots' expected SNR is the weakest path's (15 dB).
ROUNDS = 2
SETS = [f"rounds={ROUNDS}", f"eval_every={ROUNDS}", "train_samples=8000", "eval_samples=300",
        "snr_db=15"]
#: The virtual air's Es/N0 per device (20 dBm through 116, 117, 118, 121 dB of path loss).
BUDGET_SNR_DB = [20.0, 19.0, 18.0, 15.0]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.gnuradio
def test_aircomp_over_the_virtual_air_with_a_shared_reference(tmp_path: Path) -> None:
    require_gnuradio()
    out = tmp_path / "lab"
    code = launch(CONFIG, 4, out, overrides=[*SETS, "link=usrp"], hw_overrides=[],
                  hw_config=HW, round_timeout_s=120, join_timeout_s=180,
                  train_allowance_s=6.0)
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in (out / "logs").iterdir()}
    assert code == 0, logs
    run = out / "aggregator"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["link"] == "usrp", summary["status"]
    metrics = _lines(run / "metrics.jsonl")
    assert len(metrics) == ROUNDS
    bursts = [b for b in _lines(out / "air" / "air.jsonl") if "serial" in b]
    slot_bursts = [b for b in bursts if b["overlaps"]]
    pilot_bursts = [b for b in bursts if not b["overlaps"]]
    # per round: four pilots, each alone; four frames at one instant, each over the others
    assert len(pilot_bursts) == 4 * ROUNDS and len(slot_bursts) == 4 * ROUNDS, bursts
    starts = sorted({round(b["t_true_s"], 6) for b in slot_bursts})
    assert len(starts) == ROUNDS, starts  # one slot per round
    for b in slot_bursts:
        assert sorted([b["serial"], *b["overlaps"]]) == [f"edge{i}" for i in range(4)]
    lab_probe = []
    for line in metrics:
        air = line["aircomp"]
        assert air["participants"] == air["transmitted"] == 4 and not air["lost"], air
        assert air["slots"] == 1 and air["tdma_airtime_s"] > 3.5 * air["airtime_s"]
        assert "nmse" not in air  # the aggregator never sees the values
        lab_probe.append(air["probe_nmse"])
    # the symbol link at the same SNRs, in process: the same aggregation error within 3 dB
    cfg = load_experiment(CONFIG, [*SETS, "devices=4", "link=symbol",
                                   f"snr_db={BUDGET_SNR_DB}"])
    run_experiment(cfg, tmp_path / "symbol")
    sym_probe = [line["aircomp"]["probe_nmse"] for line in _lines(tmp_path / "symbol"
                                                                   / "metrics.jsonl")]
    lab_db, sym_db = (10 * math.log10(float(np.mean(v))) for v in (lab_probe, sym_probe))
    assert abs(lab_db - sym_db) <= 3.0, (lab_db, sym_db)  # measured: -21.0 and -20.9 dB
    events = [e for e in _lines(run / "ledger.jsonl") if e.get("type") == "record-aircomp/v1"]
    assert len(events) == 4 * ROUNDS
    assert all(len(e["others_noise_std"]) == 3 and e["gain_ratio_upper"] > 1 for e in events)
    assert_ledgers_agree(run, {i: out / f"edge-{i}" for i in range(4)})
    for dev in summary["privacy"]["devices"]:
        assert dev["uploads"] == ROUNDS and dev["epsilon"] <= 5.0
        assert dev["epsilon_all_colluding"] > dev["epsilon"]
    assert not processes_mentioning(str(out))


def test_aircomp_on_radios_needs_a_shared_reference(tmp_path: Path) -> None:
    """The usrp link without a PPS/10 MHz, or in one process, is refused before anything
    starts, naming the key."""
    with pytest.raises(ConfigError, match="usrp.time_source: got 'internal'; scheme aircomp"):
        launch(CONFIG, 4, tmp_path / "lab", overrides=[*SETS, "link=usrp"], hw_overrides=[],
               hw_config=str(ROOT / "hw_configs" / "virtual_lab.yaml"), round_timeout_s=10,
               join_timeout_s=10)
    assert not (tmp_path / "lab").exists()
    drifting = tmp_path / "drifting.yaml"
    drifting.write_text(Path(HW).read_text().replace(
        "serial=edge0,clock_offset_s=2.5", "serial=edge0,clock_offset_s=2.5,drift_ppm=2"))
    with pytest.raises(ConfigError, match="drift_ppm=2; scheme aircomp needs 0"):
        launch(CONFIG, 4, tmp_path / "lab", overrides=[*SETS, "link=usrp"], hw_overrides=[],
               hw_config=str(drifting), round_timeout_s=10, join_timeout_s=10)
    cfg = load_experiment(CONFIG, [*SETS, "devices=4", "link=usrp", f"hw_config={HW}"])
    with pytest.raises(ConfigError, match="runs scheme aircomp in the lab processes only"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_rounds_aircomp_part_and_the_pilot_are_checked_on_the_wire() -> None:
    from testbed.core.transport.protocol import decode, encode
    from testbed.core.transport.protocol_schema import ProtocolError

    plan = {"device": 1, "round": 2, "nonce": "x", "d": 4, "channel": None, "slot": 0,
            "deadline_s": 5.0, "mechanism": None, "tx_time_s": 10.0, "await_slot": False}
    part = {"alpha_re": 1.5, "alpha_im": -0.5, "amplitude": 0.01, "signal_power": 2e-5}
    weights = bytes(32)
    assert decode(encode("round", {**plan, "aircomp": part}, weights))["aircomp"] == part
    for bad in ({k: v for k, v in part.items() if k != "amplitude"},
                {**part, "alpha_re": "1"}, {**part, "amplitude": 0.0},
                {**part, "signal_power": True}, {**part, "extra": 1.0}):
        with pytest.raises(ProtocolError, match="aircomp"):
            encode("round", {**plan, "aircomp": bad}, weights)
    pilot = {"device": 1, "round": 2, "tx_time_s": 10.5, "n_symbols": 512}
    assert decode(encode("pilot", pilot))["n_symbols"] == 512
    with pytest.raises(ProtocolError):
        encode("pilot", {**pilot, "tx_time_s": -1.0})
