"""Record-level privacy through `testbed run`: events, enforcement, channel credit, reporting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from aggregator.state import PaperAccountingWarning
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.privacy import Ledger, RecordEvent
from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.privacy.analysis.record_device_level import device_level_epsilon
from testbed.core.record_schemes import resolve_record_uplinks
from testbed.runner import run_experiment

FEDSGD_UPLOAD = ["local_steps=1", "privacy.noise=upload", "compression.quantize=false"]


def _summary_devices(summary: dict) -> list[dict]:
    return summary["privacy"]["devices"]


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_record_run_is_enforced_and_audited_from_the_ledger(
    tmp_path: Path, tiny_overrides: list[str], accountant: str
) -> None:
    cfg = load_experiment(
        None,
        [
            *tiny_overrides,
            "scheme=ldp-fedavg",
            "privacy.epsilon=4",
            f"privacy.accountant={accountant}",
        ],
    )
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["privacy"]["unit"] == "record"
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = ledger.events()
        assert ledger.header["unit"] == "record" and ledger.header["accounting"] == accountant
    assert all(isinstance(e, RecordEvent) for e in events) and len(events) == 3 * 4
    assert all(e.steps == cfg.local_steps and e.amplified for e in events)
    for dev in _summary_devices(summary):
        mine = [e for e in events if e.device == dev["device"]]
        # independent recomputation from the ledger on disk
        for name in ("rdp", "pld"):
            acc = RecordAccountant(name, 1e-5)
            for e in mine:
                acc.add(e)
            assert acc.epsilon(dev["device"]).epsilon == pytest.approx(dev[f"epsilon_{name}"])
        assert dev["epsilon"] == dev[f"epsilon_{accountant}"] <= 4.0
        assert dev["epsilon_pld"] <= dev["epsilon_rdp"]  # PLD is the tighter accountant
        assert dev["epsilon_device_level"] == pytest.approx(device_level_epsilon(mine, 1e-5))
        assert dev["epsilon_device_level"] > 100 * dev["epsilon"]  # a record is not a device
        assert dev["unit"] == "record" and dev["delta_total"] == dev["delta"] == 1e-5


def test_upload_noise_credits_the_channel_and_reports_the_uncredited_epsilon(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    base = [*tiny_overrides, *FEDSGD_UPLOAD, "privacy.epsilon=3", "snr_db=0"]
    ldp = run_experiment(load_experiment(None, [*base, "scheme=ldp-fedavg"]), tmp_path / "ldp")
    ch = run_experiment(load_experiment(None, [*base, "scheme=channel-dp"]), tmp_path / "ch")
    for a, b in zip(_summary_devices(ldp), _summary_devices(ch), strict=True):
        assert b["channel_credited"] and not a["channel_credited"]
        assert b["sigma"] < 0.9 * a["sigma"]  # the channel carries part of the noise
        assert b["epsilon"] <= 3.0 and a["epsilon"] <= 3.0
        # An eavesdropper with a better channel sees only the artificial noise.
        assert b["epsilon_no_channel"] > 3.0 >= b["epsilon"]
        assert a["epsilon_no_channel"] == pytest.approx(a["epsilon"], rel=1e-6)
    with Ledger.open(tmp_path / "ch" / "ledger.jsonl") as ledger:
        assert all(e.channel_credited and e.steps == 1 for e in ledger.events())


@pytest.mark.parametrize("snr_db", [0, 5, 10])
def test_channel_schemes_inject_less_artificial_noise_than_ldp(
    tiny_overrides: list[str], snr_db: float
) -> None:
    hw = load_hardware("sim")
    sigmas = {}
    for scheme in ("ldp-fedavg", "channel-dp", "ee-dp-fl"):
        cfg = load_experiment(
            None, [*tiny_overrides, *FEDSGD_UPLOAD, f"scheme={scheme}", f"snr_db={snr_db}"]
        )
        up, rs = resolve_record_uplinks(cfg, hw, 7850, [150] * cfg.devices)[0]
        sigmas[scheme] = up.sigma
        assert rs.credit_channel == (scheme != "ldp-fedavg")
    assert sigmas["channel-dp"] < sigmas["ldp-fedavg"]
    assert sigmas["ee-dp-fl"] < sigmas["ldp-fedavg"]


def test_quantized_upload_credits_no_channel(tiny_overrides: list[str]) -> None:
    cfg = load_experiment(
        None, [*tiny_overrides, "local_steps=1", "privacy.noise=upload", "scheme=ee-dp-fl"]
    )
    _, rs = resolve_record_uplinks(cfg, load_hardware("sim"), 7850, [150] * 4)[0]
    assert not rs.credit_channel  # the quantizer sits between the noise and the channel


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["privacy.noise=upload", "local_steps=3"], "local_steps"),
        (["scheme=noise-after-compression"], "noise-after-compression"),
        (["privacy.sigma=1"], "privacy.noise_multiplier"),
        (["privacy.unit=device", "privacy.noise_multiplier=1"], "privacy.noise_multiplier"),
        (["batch_size=1000"], "batch_size"),
    ],
)
def test_record_unit_refuses_what_it_cannot_account(
    tmp_path: Path, tiny_overrides: list[str], overrides: list[str], key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        cfg = load_experiment(None, [*tiny_overrides, "scheme=ldp-fedavg", *overrides])
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_estimated_channel_bounds_are_charged_to_delta(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """Old bug: the bounds' failure probability was not in delta."""
    cfg = load_experiment(
        None,
        [
            *tiny_overrides,
            *FEDSGD_UPLOAD,
            "scheme=channel-dp",
            "link=waveform",
            "rounds=2",
            "snr_db=10",
            "privacy.epsilon=8",
        ],
    )
    summary = run_experiment(cfg, tmp_path / "run")
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = ledger.events()
    confidence = 1 - 1e-5 / (20 * cfg.rounds)
    assert cfg.n0_confidence() == pytest.approx(confidence)
    for dev in _summary_devices(summary):
        mine = [e for e in events if e.device == dev["device"] and e.channel_credited]
        assert mine, "the waveform link's estimated channel should be credited"
        failure = math.fsum(e.bound_failure_prob for e in mine)
        assert all(e.bound_failure_prob == pytest.approx(2 * (1 - confidence)) for e in mine)
        assert dev["delta_total"] == pytest.approx(1e-5 + failure)
        # default confidence keeps the sum <= delta / 10 (equal when every upload is credited)
        assert dev["delta_total"] <= 1.1e-5 * (1 + 1e-9)  # 1 - confidence cancels: ~1e-10


def test_meta_says_where_the_credited_noise_comes_from(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """Old bug: meta.json claimed all privacy noise came from the CSPRNG."""
    run_experiment(
        load_experiment(None, [*tiny_overrides, "scheme=ldp-fedavg", "rounds=1"]),
        tmp_path / "run",
    )
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert "seed" in meta["channel_noise_source"] and "CSPRNG" in meta["privacy_noise_source"]


def test_paper_accounting_enforcement_warns(tmp_path: Path, tiny_overrides: list[str]) -> None:
    cfg = load_experiment(
        None,
        [
            *tiny_overrides,
            "privacy.unit=device",
            "scheme=ee-dp-fl",
            "privacy.accounting=paper",
            "rounds=1",
        ],
    )
    with pytest.warns(PaperAccountingWarning, match="not a DP bound"):
        run_experiment(cfg, tmp_path / "run")


def test_progress_bar_shows_the_largest_epsilon_spent(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    seen: list[dict[str, str]] = []
    cfg = load_experiment(None, [*tiny_overrides, "scheme=ldp-fedavg", "privacy.epsilon=4"])

    class Bar:
        def update(self, n: int) -> None: ...
        def close(self) -> None: ...
        def set_postfix(self, fields: dict[str, str]) -> None:
            seen.append(fields)

    import aggregator.run_rounds as run_rounds_module

    original = run_rounds_module._progress_bar
    run_rounds_module._progress_bar = lambda *a, **k: Bar()  # type: ignore[assignment]
    try:
        summary = run_experiment(cfg, tmp_path / "run")
    finally:
        run_rounds_module._progress_bar = original
    largest = max(d["epsilon"] for d in _summary_devices(summary))
    assert seen and float(seen[-1]["eps_max"]) == pytest.approx(largest, rel=1e-2)
