"""``testbed privacy --unit record``: record-level epsilon from the command line."""

from __future__ import annotations

import json

import pytest

from testbed.cli.main import main
from testbed.core.privacy import record_epsilon_for

RECORD = ["privacy", "--unit", "record", "--q", "0.01", "--z", "1.1", "--steps", "500",
          "--delta", "1e-5"]
DEVICE = ["privacy", "--unit", "device", "--sigma", "0.7", "--alpha", "2", "--h", "0.9",
          "--n0", "0.05", "--rounds", "30", "--q", "16"]


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_record_json_matches_the_library(accountant: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RECORD, "--accountant", accountant, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = record_epsilon_for(q=0.01, z=1.1, steps=500, delta=1e-5, accountant=accountant)
    assert out["epsilon"] == expected.epsilon
    assert {k: out[k] for k in ("unit", "accountant", "delta", "q", "z", "steps", "relation")} \
        == {"unit": "record", "accountant": accountant, "delta": 1e-5, "q": 0.01, "z": 1.1,
            "steps": 500, "relation": "add-remove"}


def test_record_defaults_to_pld_and_replace_one_costs_more(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The defaults are a run's (privacy.unit record, privacy.accountant pld)."""
    assert main([*RECORD, "--json"]) == 0
    add = json.loads(capsys.readouterr().out)
    assert add["accountant"] == "pld"
    assert main([a for a in RECORD if a not in ("--unit", "record")] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out) == add
    assert main([*RECORD, "--relation", "replace-one", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] > add["epsilon"]
    assert main(RECORD) == 0
    assert "record level, pld" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "value"), [
    ("--q", "0"), ("--q", "1.5"), ("--q", "nan"), ("--z", "0"), ("--z", "-1"),
    ("--z", "nan"), ("--z", "inf"), ("--steps", "0"), ("--steps", "100000000"),
    ("--delta", "0"), ("--delta", "1"),
])
def test_record_bad_argument_is_named(flag: str, value: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = list(RECORD)
    args[args.index(flag) + 1] = value
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and value in err and "\n" not in err


def test_record_needs_its_arguments_and_refuses_device_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "--unit", "record", "--q", "0.01", "--z", "1"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert main([*RECORD, "--sigma", "1"]) == 2
    assert "--sigma" in capsys.readouterr().err


def test_device_unit_needs_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*DEVICE, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["mode"] == "strict" and "unit" not in plain
    # Without --unit the unit is record (a run's default): device options are refused.
    assert main([a for a in DEVICE if a not in ("--unit", "device")]) == 2
    err = capsys.readouterr().err
    assert "--sigma applies only to --unit device" in err and "default unit is record" in err
    missing = [a for a in DEVICE if a not in ("--n0", "0.05")]
    assert main(missing) == 2
    assert "--n0" in capsys.readouterr().err
    for extra in (["--z", "1"], ["--steps", "3"], ["--accountant", "pld"]):
        assert main([*DEVICE, *extra]) == 2
        assert extra[0] in capsys.readouterr().err
    args = list(DEVICE)
    args[args.index("--q") + 1] = "0.5"  # a sampling rate is not a quantizer level
    assert main(args) == 2
    assert "--q=0.5" in capsys.readouterr().err


def test_help_lists_the_unit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["privacy", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--unit" in out and "--accountant" in out
