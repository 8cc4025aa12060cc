"""``testbed privacy`` and ``testbed privacy-curve`` from the command line entry point."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.core.privacy import epsilon_for

ARGS = ["privacy", "--unit", "device", "--sigma", "0.7", "--alpha", "2", "--h", "0.9",
        "--n0", "0.05", "--rounds", "30", "--d", "21840", "--l", "2184", "--q", "16", "--clip", "5",
        "--delta", "1e-5"]


@pytest.mark.parametrize("mode", ["paper", "strict"])
def test_privacy_json_matches_the_library(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--mode", mode, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = epsilon_for(mode=mode, sigma=0.7, alpha=2.0, h=0.9, n0=0.05, rounds=30, d=21840,
                           l=2184, q=16, clip=5.0, delta=1e-5)
    assert out["epsilon"] == pytest.approx(expected.epsilon, rel=1e-12)
    assert out["order"] == pytest.approx(expected.order, rel=1e-12)
    assert out["mode"] == mode


def test_privacy_reports_infinite_epsilon_as_a_string(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*ARGS, "--mode", "strict", "--json"]
    args[args.index("--sigma") + 1] = "0"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == "inf"


@pytest.mark.parametrize(("flag", "value"), [("--delta", "2"), ("--l", "999999"),
                                             ("--trusted", "1.5"), ("--sigma", "-1")])
def test_privacy_bad_argument_is_named(flag: str, value: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = [*ARGS, "--json"]
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert flag in err and value in err


@pytest.mark.parametrize("command", ["privacy", "privacy-curve"])
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "21840" in capsys.readouterr().out


def test_privacy_curve_writes_csv_and_png(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["privacy-curve", "--out", str(tmp_path), "--snr-min", "-70", "--snr-max",
                 "-30", "--snr-step", "20", "--realizations", "8", "--rounds", "10", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert (tmp_path / "privacy_curve.png").stat().st_size > 1000
    with open(tmp_path / "privacy_curve.csv") as fh:
        rows = list(csv.DictReader(fh))
    # 2 channels x 2 modes x 3 schemes x 3 SNRs
    assert len(rows) == 36
    assert summary["piggyback_below_channel_only"]["awgn/paper"] is True
    assert summary["piggyback_below_channel_only"]["rayleigh/paper"] is True
    assert summary["piggyback_no_quantization_below_channel_only"]["awgn/strict"] is True
    ref = {(r["channel"], r["mode"], r["snr_db"]): float(r["eps_mean"]) for r in rows
           if r["scheme"] == "channel-only"}
    for r in rows:
        if r["scheme"] == "piggyback" and r["mode"] == "paper":
            assert float(r["eps_mean"]) < ref[(r["channel"], r["mode"], r["snr_db"])]
    # epsilon grows with SNR (less channel noise)
    awgn = sorted((float(r["snr_db"]), float(r["eps_mean"])) for r in rows
                  if r["channel"] == "awgn" and r["mode"] == "paper"
                  and r["scheme"] == "channel-only")
    assert all(a[1] < b[1] for a, b in zip(awgn, awgn[1:], strict=False))


def test_privacy_curve_refuses_bad_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["privacy-curve", "--out", str(tmp_path), "--snr-min", "0",
                 "--snr-max", "-10"]) == 2
    assert "--snr-max" in capsys.readouterr().err
