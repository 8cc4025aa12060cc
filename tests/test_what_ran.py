"""Every output says what ran: the summary's ``radios`` (real, virtual or emulated radios)
and the fading the channel applied (the virtual air's or the hardware config's, not the
experiment's default), the outcome line and the report's title and settings."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from aggregator.outcome import outcome_line
from aggregator.summary import applied_fading, radios_of
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.report import write_report
from testbed.runner import run_experiment

ROOT = Path(__file__).resolve().parents[1]


def _state(hw_name: str, *sets: str) -> SimpleNamespace:
    hw_path = str(ROOT / "hw_configs" / f"{hw_name}.yaml")
    cfg = load_experiment(None, [f"hw_config={hw_path}", *sets])
    return SimpleNamespace(cfg=cfg, hw=load_hardware(hw_path))


def test_radios_say_real_virtual_or_none() -> None:
    assert radios_of(_state("virtual_lab")) == "virtual"  # type: ignore[arg-type]
    assert radios_of(_state("lab_ota")) == "usrp"  # type: ignore[arg-type]
    assert radios_of(_state("virtual_lab", "link=waveform")) is None  # type: ignore[arg-type]
    assert radios_of(_state("sim")) is None  # type: ignore[arg-type]


def test_fading_is_what_the_air_or_the_hardware_config_applied() -> None:
    darkroom = applied_fading(_state("virtual_darkroom"))  # type: ignore[arg-type]
    assert darkroom["model"] == "rayleigh" and darkroom["speed_kmh"] == 20.0, darkroom
    assert "virtual air" in darkroom["source"]
    emulator = applied_fading(_state("darkroom"))  # type: ignore[arg-type]
    assert emulator["model"] == "rayleigh" and "hardware config" in emulator["source"]
    sim = applied_fading(_state("sim", "fading=rician", "rician_k_db=6"))  # type: ignore[arg-type]
    assert sim == {"model": "rician", "source": "experiment config"}


def test_outcome_line_and_report_name_virtual_radios_and_the_applied_fading(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """A run's report shows the summary's radios in its title and settings and the
    applied fading (here a summary as a virtual darkroom run writes it)."""
    run = tmp_path / "run"
    summary = run_experiment(load_experiment(None, [*tiny_overrides, "rounds=1"]), run)
    assert summary["fading"] == {"model": "none", "source": "experiment config"}
    assert "radios" not in summary  # the in-process symbol link has none
    summary |= {"radios": "virtual", "fading": {
        "model": "rayleigh", "source": "virtual air (virtual_air.fading)", "speed_kmh": 20.0}}
    (run / "summary.json").write_text(json.dumps(summary))
    assert outcome_line(summary, run).startswith("run completed on virtual radios: 1/1")
    report = write_report(run).read_text()
    assert report.splitlines()[0].endswith(", on virtual radios"), report.splitlines()[0]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in report.splitlines() if line.startswith("| ") and line.count("|") > 3}
    assert rows["radios"] == "virtual", rows
    assert rows["fading applied"] == "rayleigh" and rows["speed (km/h)"] == "20", rows
    assert "virtual air" in rows["fading imposed by"]
    assert "fading (experiment config; the applied one below)" in rows
