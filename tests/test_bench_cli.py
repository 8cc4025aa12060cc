"""``testbed bench``: the figures protocol, the table, unknown names, failures and timeouts.

The CLI is pointed (hidden ``--dir``) at a directory of tiny benchmark scripts written here,
so nothing slow runs; no assertion is about how long anything took.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from testbed.bench_figures import FigureError, figure, format_table, parse_figures
from testbed.cli.main import main

GOOD = """
import json, sys
full = "--full" in sys.argv
figs = [
    {"name": "speed", "value": 8.0 if full else 4.0, "baseline": 2.0, "unit": "Msample/s",
     "better": "higher", "aim": 2.0, "baseline_name": "the other one"},
    {"name": "time", "value": 3.0, "baseline": 1.0, "unit": "s", "better": "lower",
     "ratio": 3.0, "aim": 2.0, "note": "slow"},
]
print("progress", file=sys.stderr)
print("some text first")
print(json.dumps({"size": 1, "figures": figs}))
"""

SLEEPER = """
import os, subprocess, sys, time
# A child that would outlive the script if only the script were stopped.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(os.environ["BENCH_PIDS"], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(60)
"""


def _write(d: Path, name: str, body: str) -> None:
    (d / f"bench_{name}.py").write_text(textwrap.dedent(body))


def _rows(out: str, bench: str) -> list[str]:
    """The table's lines of ``bench``, with runs of spaces squeezed."""
    return [" ".join(ln.split()) for ln in out.splitlines() if ln.split()[:1] == [bench]]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its parent) counts as stopped.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.fixture()
def bench_dir(tmp_path: Path) -> Path:
    d = tmp_path / "benchmarks"
    d.mkdir()
    _write(d, "good", GOOD)
    return d


def test_figure_ratio_and_aims() -> None:
    f = figure("a", 6.0, 2.0, "Msample/s", better="higher", aim=2.0)
    assert f.ratio == 3.0 and f.met is True
    g = figure("b", 3.0, 1.0, "s", better="lower", aim=2.0)
    assert g.ratio == 3.0 and g.met is False
    h = figure("c", 0.4, 4.0, "s", better="lower", aim_value=0.5)
    assert h.met is True and h.aim is None
    assert figure("d", 1.0, 1.0, "x", better="higher").met is None
    with pytest.raises(FigureError, match="better='up'"):
        figure("e", 1.0, 1.0, "x", better="up")
    with pytest.raises(FigureError, match="baseline > 0"):
        figure("f", 1.0, 0.0, "x", better="higher")


def test_parse_rejects_bad_figures() -> None:
    ok = {"name": "a", "value": 2.0, "baseline": 1.0, "unit": "s", "better": "lower"}
    assert parse_figures({"figures": [ok]})[0].ratio == 2.0
    with pytest.raises(FigureError, match="list 'figures'"):
        parse_figures({"results": []})
    with pytest.raises(FigureError, match="'value' must be a number"):
        parse_figures({"figures": [{**ok, "value": "fast"}]})
    with pytest.raises(FigureError, match="ratio 0.5 != value / baseline"):
        parse_figures({"figures": [{**ok, "ratio": 0.5}]})
    with pytest.raises(FigureError, match="names repeat"):
        parse_figures({"figures": [ok, ok]})
    with pytest.raises(FigureError, match="'name'"):
        parse_figures({"figures": [{**ok, "name": ""}]})


def test_table_has_every_column() -> None:
    f = figure("speed", 4.0, 2.0, "Msample/s", better="higher", aim=2.0)
    text = format_table([("radio", f, "ok"), ("solver", None, "timed out: stopped")])
    head = text.splitlines()[0].split()
    assert head == ["benchmark", "figure", "value", "baseline", "ratio", "aim", "met"]
    assert "2.00x" in text and ">=2x" in text and "yes" in text
    assert _rows(text, "solver") == ["solver timed out: stopped"]


def test_bench_tabulates_figures(bench_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dir", str(bench_dir)]) == 0
    out = capsys.readouterr().out
    assert _rows(out, "good") == [
        "good speed 4 Msample/s 2 Msample/s 2.00x >=2x yes",
        "good time 3 s 1 s 3.00x <=2x NO",
    ]
    assert "good/speed: baseline = the other one" in out


def test_bench_passes_full_and_json(bench_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dir", str(bench_dir), "--full", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    good = result["benchmarks"]["good"]
    assert result["full"] is True and good["status"] == "ok"
    assert {f["name"]: f["ratio"] for f in good["figures"]} == {"speed": 4.0, "time": 3.0}
    assert good["output"]["size"] == 1


def test_bench_unknown_name(bench_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dir", str(bench_dir), "good", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark(s) ['nosuch']" in err and "allowed: ['good']" in err


def test_bench_reports_failures_and_bad_output(
    bench_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(bench_dir, "crash", "import sys; sys.exit(3)\n")
    _write(bench_dir, "nofigs", "import json; print(json.dumps({'x': 1}))\n")
    _write(bench_dir, "inverted", GOOD.replace('"ratio": 3.0', '"ratio": 0.333'))
    assert main(["bench", "--dir", str(bench_dir)]) == 1
    out = capsys.readouterr().out
    assert _rows(out, "crash") == ["crash failed: exit status 3 (see its stderr)"]
    assert _rows(out, "nofigs") == [
        "nofigs bad output: bench_nofigs.py: need a JSON object with a list 'figures'"
    ]
    assert "ratio 0.333 != value / baseline" in _rows(out, "inverted")[0]
    assert len(_rows(out, "good")) == 2


def test_bench_stops_a_script_past_its_timeout(
    bench_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("BENCH_PIDS", str(pids))
    _write(bench_dir, "sleeper", SLEEPER)
    assert main(["bench", "--dir", str(bench_dir), "--timeout", "5", "sleeper", "good"]) == 1
    out = capsys.readouterr().out
    assert _rows(out, "sleeper") == ["sleeper timed out: stopped after 5 s (--timeout)"]
    assert len(_rows(out, "good")) == 2
    script_pid, child_pid = map(int, pids.read_text().split())
    assert not _alive(script_pid) and not _alive(child_pid)


def test_bench_budget_skips_the_rest(bench_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(bench_dir, "a_slow", "import time; time.sleep(2)\n")
    assert main(["bench", "--dir", str(bench_dir), "--budget", "1", "a_slow", "good"]) == 1
    out = capsys.readouterr().out
    assert _rows(out, "a_slow") == [
        "a_slow timed out: stopped after 1 s (what is left of --budget)"
    ]
    assert _rows(out, "good") == ["good skipped: the 1 s budget is spent"]


def test_bench_refuses_bad_limits(bench_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dir", str(bench_dir), "--timeout", "0"]) == 2
    assert "--timeout 0; allowed: > 0" in capsys.readouterr().err
