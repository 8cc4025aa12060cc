"""Say what the guarantee rests on (DESIGN.md, "Privacy accounting"): the trust text of a
run is generated from what it did. When a device adds no noise of its own (sigma = 0, e.g.
channel-dp at 20 dB or under a plan), every output says that its guarantee rests on the
channel's noise alone, what that trusts, and shows ``epsilon_no_channel`` beside the
enforced epsilon; an aircomp text names the number of shares the accounting withholds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aggregator.outcome import (
    aircomp_trust,
    channel_only_sentence,
    noiseless_devices,
    noiseless_plan_note,
    outcome_line,
    trust_fields,
    trust_statement,
)
from aggregator.solver.aircomp_plan import plan_aircomp
from aggregator.state import ChannelOnlyNoiseWarning
from testbed.cli.main import main
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.config.plan_file import load_plan
from testbed.core.record_schemes import RecordSettings
from testbed.core.schemes import DeviceUplink
from testbed.runner import run_experiment

CREDITED = {"credited_fraction": 1.0, "source": "simulated, drawn from the OS CSPRNG",
            "secret": True, "reason": ""}
#: Words every statement about devices without noise carries.
RESTS = "guarantee rests on the channel's noise alone"
TRUSTS = "the aggregator does not learn its receiver's noise"
NO_PROTECTION = ("no protection against an eavesdropper with a better channel, nor against "
                 "the aggregator itself if it knows that noise")
#: Today's statement of a credited local-model run, word for word.
LOCAL_CREDITED = (
    "Local model: each device adds its artificial noise before its upload leaves it. The "
    "enforced epsilon also credits 100% of the channel noise the aggregator's receiver adds, "
    "which is secret (simulated, drawn from the OS CSPRNG): it holds against the aggregator, "
    "assuming it does not learn that noise. It does not hold against an eavesdropper with a "
    "better channel, nor anyone who knows the channel noise: against them only the "
    "artificial noise counts (epsilon_no_channel)."
)


def test_no_device_adds_noise_the_statement_says_the_channel_alone_protects() -> None:
    text = trust_statement(CREDITED, "record", silent=[0, 1, 2, 3], devices=4)
    assert text.startswith("All 4 devices add no noise of their own (sigma = 0)")
    assert RESTS in text and TRUSTS in text and NO_PROTECTION in text
    assert "epsilon_no_channel" in text
    assert "each device adds its artificial noise" not in text
    assert "Local model" not in text
    device_unit = trust_statement(CREDITED, "device", silent=[0, 1, 2, 3], devices=4)
    assert "`testbed privacy --trusted 0` computes it" in device_unit


def test_some_devices_without_noise_are_named_and_the_others_keep_the_local_model() -> None:
    text = trust_statement(CREDITED, "record", silent=[1, 3], devices=4)
    sentence = channel_only_sentence([1, 3], 4, credited=1.0, unit="record")
    assert text.startswith(sentence)
    assert sentence.startswith("Devices 1 and 3 (2 of 4) add no noise of their own")
    assert "Local model for the other 2 devices: each adds its artificial noise" in text
    one = channel_only_sentence([2], 4, credited=1.0, unit="record")
    assert one.startswith("Device 2 (1 of 4) adds no noise of its own (sigma = 0), so its "
                          "guarantee rests")
    many = channel_only_sentence(list(range(20)), 100, credited=1.0, unit="record")
    assert many.startswith("Devices 0, 1, 2, 3, 4, 5 and 14 more (20 of 100) add")


def _record(step_z: float = 0.0, laplace: float = 0.0) -> RecordSettings:
    return RecordSettings(noise="per-step" if step_z else "upload", steps=1,
                          sampling_rate=0.1, amplified=True, example_clip=1.0,
                          expected_batch=16.0, dataset_size=160, step_noise_multiplier=step_z,
                          target_noise_multiplier=1.0, relation="add-remove",
                          credit_channel=False, laplace_scale=laplace)


def test_every_device_adds_noise_the_statement_is_unchanged() -> None:
    assert trust_statement(CREDITED, "record", silent=[], devices=4) == LOCAL_CREDITED
    assert noiseless_devices([0.1, 0.2, 1e-9]) == []
    assert noiseless_devices([0.1, 0.0, 0.2, 0.0]) == [1, 3]
    # noise at every local step, or Laplace noise, leaves the upload's sigma at 0: not silent
    assert noiseless_devices([0.0, 0.0, 0.0],
                             [_record(step_z=1.1), _record(laplace=0.2), _record()]) == [2]


def test_no_noise_and_no_credit_says_nothing_protects_them() -> None:
    none = {**CREDITED, "credited_fraction": 0.0, "reason": "the link's noise is seeded"}
    text = trust_statement(none, "record", silent=[0], devices=2)
    assert text.startswith("Device 0 (1 of 2) adds no noise of its own (sigma = 0) and no "
                           "channel noise is credited: nothing protects its uploads")
    assert "Local model for the other 1 devices" in text


def test_aircomp_statement_without_device_noise() -> None:
    every = aircomp_trust(CREDITED, 0, 0, silent=list(range(10)), devices=10)
    assert every.startswith("Distributed model (over-the-air aggregation): All 10 devices add "
                            "no noise of their own (sigma = 0)")
    assert RESTS in every and TRUSTS in every and NO_PROTECTION in every
    assert "adds its share of the noise" not in every
    some = aircomp_trust(CREDITED, 1, 1, silent=[4], devices=10)
    assert "Device 4 (1 of 10) adds no noise of its own" in some
    assert "The other 9 devices add their shares of the noise" in some
    assert "every device adds its share" not in some
    plain = aircomp_trust(CREDITED, 0, 0, silent=[], devices=10)
    assert "every device adds its share of the noise" in plain and RESTS not in plain


def _aircomp_fields(extra: list[str], sigma: float) -> dict[str, Any]:
    cfg = load_experiment(None, ["scheme=aircomp", "devices=10", "privacy.noise=upload",
                                 "local_steps=1", "link=symbol", *extra])
    up = DeviceUplink(mechanism="before", sigma=sigma, alpha=1.0, l=10, levels=None,
                      trusted=1.0, quantizer_scale="norm", expected_power=1.0)
    return trust_fields(cfg, load_hardware("sim"), "record", [up] * cfg.devices)


def test_aircomp_text_names_the_shares_the_accounting_withholds() -> None:
    """colluding_devices 3 and dropout_margin 1: the events withhold 4 shares
    (:func:`testbed.core.config.aircomp_checks.aircomp_colluding`), and the text says 4."""
    fields = _aircomp_fields(["privacy.colluding_devices=3", "privacy.dropout_margin=1"], 0.1)
    trust = fields["trust"]
    assert "less the 4 largest shares" in trust and "less the 3 largest" not in trust
    assert "3 for privacy.colluding_devices" in trust
    assert "1 for privacy.dropout_margin" in trust
    assert fields["devices_without_noise"] == []
    plain = _aircomp_fields(["privacy.colluding_devices=2"], 0.1)["trust"]
    assert "less the 2 largest shares (privacy.colluding_devices" in plain
    silent = _aircomp_fields([], 0.0)
    assert silent["devices_without_noise"] == list(range(10))
    assert silent["trust"].startswith("Distributed model (over-the-air aggregation): All 10 "
                                      "devices add no noise of their own")


def _summary(sigmas: list[float], no_channel: list[Any]) -> dict[str, Any]:
    return {
        "status": "completed", "rounds_completed": 3, "rounds_planned": 3,
        "final_accuracy": 0.5, "lost_uploads": 0, "wall_time_s": 1.0, "reason": "",
        "privacy": {
            "unit": "record", "enforced_accounting": "pld", "channel_noise": CREDITED,
            "devices_without_noise": noiseless_devices(sigmas),
            "devices": [{"device": i, "sigma": s, "epsilon": 2.1, "epsilon_no_channel": nc}
                        for i, (s, nc) in enumerate(zip(sigmas, no_channel, strict=True))],
        },
    }


def test_outcome_line_gives_epsilon_without_channel_and_the_sentence() -> None:
    text = outcome_line(_summary([0.0, 0.0], ["inf", "inf"]), "run")
    second, first = text.split("\n")  # the note, then the outcome (still the last line)
    assert first == ("run completed: 3/3 rounds, final test accuracy 0.5000, max epsilon 2.1 "
                     "(record, pld; without channel noise: inf), 1.0 s -> run")
    assert second == "note: " + channel_only_sentence([0, 1], 2, credited=1.0, unit="record")
    some = outcome_line(_summary([0.5, 0.0], [3.5, "inf"]), "run")
    assert "(record, pld; without channel noise: inf)" in some
    assert some.split("\n")[0].startswith("note: Device 1 (1 of 2) adds no noise of its own")
    noisy = outcome_line(_summary([0.5, 0.4], [3.5, 3.0]), "run")
    assert noisy == ("run completed: 3/3 rounds, final test accuracy 0.5000, max epsilon 2.1 "
                     "(record, pld), 1.0 s -> run")


def test_a_channel_dp_run_without_device_noise_says_so(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """channel-dp credits the channel noise and, where it is enough (testbed/config/
    private-fedsgd.yaml at 20 dB; here the tiny data's batch at 0 dB), sets sigma = 0 on
    every device: the run warns when it starts, and its summary, outcome line and report say
    that the guarantee rests on the channel's noise alone."""
    sets = [o for o in tiny_overrides
            if not o.startswith(("local_steps", "rounds", "lr", "batch_size"))]
    cfg = load_experiment(None, [*sets, "scheme=channel-dp", "rounds=2", "local_steps=1",
                                 "lr=0.5", "privacy.noise=upload", "batch_size=100",
                                 "privacy.epsilon=20", "snr_db=0", "partition=iid"])
    with pytest.warns(ChannelOnlyNoiseWarning, match=RESTS):
        summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary
    privacy = summary["privacy"]
    assert [d["sigma"] for d in privacy["devices"]] == [0.0] * 4
    sentence = channel_only_sentence([0, 1, 2, 3], 4, credited=1.0, unit="record")
    assert privacy["trust"].startswith(sentence)
    assert "each device adds its artificial noise" not in privacy["trust"]
    assert privacy["devices_without_noise"] == [0, 1, 2, 3]
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    line = outcome_line(on_disk, tmp_path / "run")
    assert "(record, pld; without channel noise: inf)" in line.split("\n")[1]
    assert line.split("\n")[0] == "note: " + sentence
    assert main(["report", str(tmp_path / "run")]) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"| trust assumption | {privacy['trust']} |" in report
    assert "| max ε without channel noise (epsilon_no_channel) | inf |" in report
    assert "| devices adding no noise (sigma = 0) | 4 |" in report
    assert "| ε pld (enforced) | ε pld, no channel credit |" in report


def test_a_plan_that_sets_sigma_zero_says_so(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [o for o in tiny_overrides if not o.startswith(("local_steps", "rounds", "lr"))]
    sets += ["local_steps=1", "lr=0.5", "privacy.noise=upload", "compression.quantize=false",
             "privacy.accountant=rdp"]
    scn = tmp_path / "scn.yaml"
    scn.write_text("solver: {beta1: 3.0, beta2: 0.1, k_max: 300}\n")
    out = tmp_path / "plan.yaml"
    args = ["plan", "--scheme", "channel-dp", "--no-peers", "--scenario", str(scn),
            "--out", str(out)]
    assert main([*args, *[x for o in sets for x in ("--set", o)]]) == 0
    printed = capsys.readouterr().out
    plan = load_plan(out)
    assert [d.sigma for d in plan.devices] == [0.0] * 4
    note = noiseless_plan_note([0, 1, 2, 3], 4, credited=1.0, unit="record")
    assert note.startswith("Under this plan, all 4 devices add no noise of their own")
    assert note in plan.notes  # the plan file's notes
    assert f"note: {note}" in printed


def test_an_aircomp_plan_with_no_shares_says_so() -> None:
    plan = plan_aircomp(gains=[1.0, 0.9, 0.8], n0=0.01, p_max=[1.0] * 3, z_var=1e-4,
                        colluding=0, tau=1.0, eta=0.1, signal_power=lambda s: 1.0 + s * s,
                        joules_per_unit_power=1e-3)
    assert plan.sigma == 0.0
    assert plan.notes[0] == noiseless_plan_note([0, 1, 2], 3, credited=1.0, unit="record")
