"""The README's Python API example runs as it is written (only its output directory is
moved under the test's temporary directory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_api_example() -> str:
    """The first ``python`` block of the README's "Python API" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README: no python block under '## Python API'"
    return blocks[0]


def test_readme_api_example_runs(tmp_path: Path) -> None:
    code = readme_api_example()
    assert '"runs/api-example"' in code
    code = code.replace('"runs/api-example"', repr(str(tmp_path / "api-example")))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("completed ")
    lines = [line for line in out.splitlines() if line.startswith("device ")]
    assert len(lines) == 10 and all("per record (pld, delta 1e-05)" in x for x in lines)
    assert (tmp_path / "api-example" / "report.md").is_file()
    assert (tmp_path / "api-example" / "ledger.jsonl").is_file()


def test_the_api_result_carries_the_summary(tmp_path: Path, tiny_overrides: list[str]) -> None:
    """A fedavg run through the API: status, accuracy, energy per device, no epsilon; the
    CLI's exit code for the same outcome."""
    from testbed import api

    result = api.run(api.load_config(None, tiny_overrides), tmp_path / "run", report=False)
    assert result.status == "completed" and result.exit_code == 0
    assert result.accuracy == result.summary["final_accuracy"] is not None
    assert result.rounds_completed == 3 and result.report_path is None
    assert [d.device for d in result.devices] == [0, 1, 2, 3]
    assert all(d.epsilon is None and d.energy_comm_j > 0 for d in result.devices)
    assert result.max_epsilon is None and result.run_dir == tmp_path / "run"


def test_a_bad_key_is_refused_by_name() -> None:
    import pytest

    from testbed import api

    with pytest.raises(api.ConfigError, match="rounds"):
        api.load_config(None, ["rounds=-1"])
