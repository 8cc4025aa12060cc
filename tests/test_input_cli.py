"""``testbed plan|calibrate|privacy|privacy-curve`` refuse bad input with one line, exit 2.

Each case used to end in a traceback (or ran the whole job before failing); now the
refusal comes before any work, names the option, and is a single ``testbed: error:`` line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.core.config.plan_file import load_plan

COORD = ["--set", "clip.mode=coordinate", "--set", "privacy.unit=device",
         "--set", "privacy.accounting=paper"]
#: No data set here: a calibrate case that got as far as training would fail loudly.
NO_DATA = ["--set", "data_dir=/nonexistent-testbed-data"]
PRIVACY = ["privacy", "--unit", "device", "--sigma", "0.1", "--alpha", "1", "--h", "1",
           "--n0", "0.01", "--rounds", "10"]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("testbed: error: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)))
    scenario = tmp_path / "scn.yaml"
    scenario.write_text("solver: 5\n")
    return {"dir": tmp_path, "blob": blob, "scenario": scenario}


def test_plan_out_directory_is_refused_before_planning(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["plan", *COORD, "--no-peers", "--out", str(files["dir"])], capsys,
             "--out", "is a directory")
    _refused(["plan", *COORD, "--no-peers", "--out", str(files["blob"] / "p.yaml")], capsys,
             "--out", "is a file, not a directory")


def test_plan_scenario_errors(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["plan", *COORD, "--scenario", str(files["scenario"])], capsys,
             "scenario file key 'solver'")
    _refused(["plan", *COORD, "--scenario", str(files["blob"])], capsys,
             "scenario file", "not UTF-8")
    _refused(["plan", *COORD, "--scenario", str(files["dir"])], capsys, "is a directory")


def test_plan_binary_config(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["plan", str(files["blob"])], capsys, "config file", "blob.bin", "not UTF-8")


def test_plan_takes_hw_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["plan", *COORD, "--hw-set", "symbol_rate_hz=true"], capsys,
             "hardware config key 'symbol_rate_hz'")
    _refused(["plan", *COORD, "--hw-set", "symbol_rate_hz"], capsys, "--hw-set 'symbol_rate_hz'")
    out = tmp_path / "plan.yaml"
    assert main(["plan", *COORD, "--set", "devices=2", "--no-peers", "--json",
                 "--hw-set", "symbol_rate_hz=1e6", "--out", str(out)]) == 0
    capsys.readouterr()
    assert load_plan(out).t_cm_s == pytest.approx(1e-6)


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--target-loss", "nan"], ["--target-loss", "nan"]),
        (["--target-loss", "-1"], ["--target-loss", "-1"]),
        (["--hw-set", "symbol_rate_hz=-1"], ["hardware config key 'symbol_rate_hz'"]),
        (["--unit", "device", "--sigmas", "1e308", "0"], ["--sigmas", "1e+308", "<= 1e6"]),
        (["--unit", "device"], ["the config's data set", "/nonexistent-testbed-data"]),
        (["--set", "local_steps=1", "--set", "privacy.noise=upload"],
         ["the config's data set", "/nonexistent-testbed-data"]),
        ([], ["config key 'local_steps': got 20", "--unit device"]),
    ],
)
def test_calibrate_refuses_before_training(
    extra: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["calibrate", *NO_DATA, *extra], capsys, *fragments)


def test_calibrate_output_paths(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["calibrate", *NO_DATA, "--out", str(files["dir"])], capsys,
             "--out", "is a directory")
    _refused(["calibrate", *NO_DATA, "--runs-dir", str(files["blob"])], capsys,
             "--runs-dir", "not a directory")
    runs = files["dir"] / "runs"
    (runs / "pilot-00").mkdir(parents=True)
    _refused(["calibrate", *NO_DATA, "--runs-dir", str(runs)], capsys,
             "--runs-dir", "pilot-00", "already exists")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--alpha", "1e308"), ("--sigma", "1e308"), ("--clip", "1e308"), ("--n0", "1e300"),
     ("--h", "1e300")],
)
def test_privacy_refuses_values_that_overflow(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = list(PRIVACY)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    _refused(argv, capsys, f"{option}=", "is not allowed")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--snr-max=inf"], "--snr-max=inf"),
        (["--snr-min=-inf"], "--snr-min=-inf"),
        (["--snr-step", "1e-300"], "SNR points"),
        (["--realizations", str(10**9)], "--realizations"),
        (["--rounds", str(10**9)], "--rounds"),
        (["--realizations", "10000", "--rounds", "10000"], "channel draws"),
    ],
)
def test_privacy_curve_refuses_huge_or_infinite_grids(
    tmp_path: Path, extra: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["privacy-curve", "--no-plot", "--out", str(tmp_path / "c"), *extra], capsys,
             fragment)
    assert not (tmp_path / "c").exists()


def test_privacy_curve_out_under_a_file(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["privacy-curve", "--no-plot", "--out", str(files["blob"] / "x")], capsys,
             "--out", "is a file, not a directory")
