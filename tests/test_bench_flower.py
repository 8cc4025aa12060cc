"""``benchmarks/bench_flower.py`` without Flower: the order of the runs, the figures built
from given measurements, and the skip when Flower is not importable. Nothing is run or
timed; Flower need not be installed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from testbed.bench_figures import parse_figures

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_flower.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_flower_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(bench: ModuleType, wall: float, cpu: float, pss: float, acc: float) -> object:
    return bench.Measured(
        wall_s=wall, cpu_s=cpu, cpu_reaped_s=cpu, cpu_sampled_s=cpu / 2, peak_pss_mib=pss,
        peak_rss_mib=2 * pss, max_process_rss_mib=pss, processes=3, pss_at_peak_mib={},
        accuracy=acc,
    )


def test_plan_alternates_the_sides(bench: ModuleType) -> None:
    labels = [(s.job, s.label) for s in bench.plan(["default", "private"], "all", 2)]
    one = ["testbed workers=auto", "flower parallel=1", "testbed workers=1",
           "flower parallel=2"]
    assert labels[:8] == [("default", x) for x in one + one[::-1]]
    # the private job runs the parallel settings only, unless all-jobs
    assert [x for _, x in labels[8:]] == ["testbed workers=auto", "flower parallel=2",
                                         "flower parallel=2", "testbed workers=auto"]
    assert len(bench.plan(["private"], "all-jobs", 1)) == 4


def test_figures_compare_each_sides_best_setting(bench: ModuleType) -> None:
    s = bench.Setting
    results = {
        s("testbed", "default", "auto"): [_run(bench, 10.0, 18.0, 500.0, 0.80),
                                          _run(bench, 12.0, 20.0, 520.0, 0.80),
                                          _run(bench, 30.0, 22.0, 540.0, 0.80)],
        s("testbed", "default", "1"): [_run(bench, 15.0, 14.0, 400.0, 0.80)] * 3,
        s("flower", "default", "1"): [_run(bench, 60.0, 50.0, 2000.0, 0.79)] * 3,
        s("flower", "default", "2"): [_run(bench, 40.0, 60.0, 3000.0, 0.78)] * 3,
    }
    figs = {f.name: f for f in bench.job_figures(results, "default", "a note")}
    assert list(figs) == ["default_job_wall", "default_job_cpu", "default_job_memory",
                          "default_job_accuracy"]
    # best = least median wall: testbed workers=auto (median 12 s), Flower parallel=2
    wall = figs["default_job_wall"]
    assert (wall.value, wall.baseline, wall.ratio) == (12.0, 40.0, 0.3)
    assert wall.aim == 0.25 and wall.met is False and wall.better == "lower"
    assert "parallel=2" in wall.baseline_name and "median of 3" in wall.note
    assert figs["default_job_cpu"].ratio == pytest.approx(20.0 / 60.0)
    assert figs["default_job_cpu"].met is True
    mem = figs["default_job_memory"]
    assert mem.ratio == pytest.approx(520.0 / 3000.0) and mem.unit == "MiB"
    acc = figs["default_job_accuracy"]
    assert (acc.value, acc.baseline, acc.better, acc.aim) == (0.80, 0.78, "higher", None)
    # the protocol's own parser takes them back unchanged
    parsed = parse_figures({"figures": [f.to_json() for f in figs.values()]})
    assert [f.ratio for f in parsed] == [f.ratio for f in figs.values()]


def test_memory_floor_is_a_torch_import_against_flowers_best(bench: ModuleType) -> None:
    floor = bench.measure_floor(0.05)  # a real interpreter importing numpy and torch
    assert 60.0 < floor < 2000.0, floor  # torch alone maps well over 60 MiB
    s = bench.Setting
    results = {s("flower", "default", "1"): [_run(bench, 60.0, 50.0, 2000.0, 0.79)],
               s("flower", "default", "2"): [_run(bench, 40.0, 60.0, 3000.0, 0.78)]}
    fig = bench.floor_figure(results, [200.0, 230.0, 210.0], "n")
    assert (fig.name, fig.value, fig.baseline) == ("memory_floor", 210.0, 3000.0)
    assert fig.aim is None and fig.unit == "MiB" and "parallel=2" in fig.baseline_name


def test_private_figures_have_no_aims(bench: ModuleType) -> None:
    s = bench.Setting
    results = {s("testbed", "private", "auto"): [_run(bench, 20.0, 30.0, 900.0, 0.5)],
               s("flower", "private", "2"): [_run(bench, 25.0, 45.0, 2500.0, 0.5)]}
    figs = bench.job_figures(results, "private", "n")
    assert [f.name for f in figs][0] == "private_job_wall"
    assert all(f.aim is None and f.met is None for f in figs)
    assert "Opacus" in figs[0].baseline_name


def test_without_flower_it_skips_with_status_0(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "flower_missing",
                        lambda path, need_opacus: "Flower is not importable: no flwr")
    assert bench.main(["--json"]) == 0
    out = capsys.readouterr()
    last = json.loads(out.out.strip().splitlines()[-1])
    assert last["figures"] == [] and "not importable" in last["skipped"]
    assert "skipped" in out.err
