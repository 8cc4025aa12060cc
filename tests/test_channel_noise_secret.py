"""Credited channel noise is secret; seeded channel noise is never credited.

Audit finding (issue 21, item 3): the in-process channel drew its noise from
``experiment_generator(seed, Stream.CHANNEL, device, round)``, with the seed in
``config.yaml``: the credited noise could be regenerated to 1e-16 from the run directory.
Now a run that credits channel noise draws it from the OS CSPRNG
(:class:`testbed.core.channel_credit.CsprngChannelNoise`), while the fading stays seeded; a link
whose noise is seeded (GNU Radio's fast noise table) credits nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import testbed.local_devices as local_devices_module
from aggregator.outcome import trust_statement
from radio.channel import awgn
from radio.link import Reception
from testbed.core.channel_credit import (
    calibration_config,
    channel_credit,
    credited_config,
    link_noise,
)
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.links import channel_params, make_link
from testbed.core.privacy import Ledger
from testbed.core.seeding import Stream, experiment_generator
from testbed.runner import run_experiment
from tests.radio_helpers import require_gnuradio, unit_payload

#: Record unit, noise once at the upload, no quantizer: channel-dp credits the channel.
CREDITED = [
    "scheme=channel-dp", "local_steps=1", "privacy.noise=upload", "compression.quantize=false",
    "privacy.epsilon=3", "snr_db=5",
]


class _Recorder:
    """Wraps the run's link; keeps every upload's symbols and reception."""

    uploads: list[tuple[int, int, np.ndarray, Reception]]

    def __init__(self, inner: Any, uploads: list) -> None:
        self.inner = inner
        self.uploads = uploads

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> _Recorder:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)

    def transmit(self, *, device: int, round_index: int, symbols: Any, rng: Any) -> Reception:
        rec = self.inner.transmit(device=device, round_index=round_index, symbols=symbols, rng=rng)
        self.uploads.append((device, round_index, np.array(symbols), rec))
        return rec


def _recorded_run(
    monkeypatch: pytest.MonkeyPatch, cfg: Any, run: Path
) -> tuple[dict, dict[tuple[int, int], tuple[np.ndarray, Reception]]]:
    uploads: list = []
    real = local_devices_module.make_link
    monkeypatch.setattr(
        local_devices_module, "make_link", lambda *a, **k: _Recorder(real(*a, **k), uploads)
    )
    summary = run_experiment(cfg, run)
    assert summary["status"] == "completed", summary
    return summary, {(i, t): (x, rec) for i, t, x, rec in uploads}


def test_credited_channel_noise_is_not_regenerated_from_the_seed(
    tmp_path: Path, tiny_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the audit did, redone: the seed's channel stream gives the fading, not the noise;
    and two runs with one seed share every fading gain but no noise."""
    cfg = load_experiment(None, [*tiny_overrides, *CREDITED, "fading=rayleigh", "rounds=2"])
    hw = load_hardware("sim")
    params = channel_params(cfg, hw)
    first, ups_a = _recorded_run(monkeypatch, cfg, tmp_path / "a")
    _, ups_b = _recorded_run(monkeypatch, cfg, tmp_path / "b")
    assert first["link"] == "symbol" and len(ups_a) == cfg.devices * cfg.rounds
    # The run did credit the channel noise it drew.
    channel = first["privacy"]["channel_noise"]
    assert channel["secret"] and channel["credited_fraction"] == 1.0
    assert "CSPRNG" in channel["source"]
    with Ledger.open(tmp_path / "a" / "ledger.jsonl") as ledger:
        assert all(e.channel_credited and e.trusted_channel_noise == 1.0 for e in ledger.events())
    for (i, t), (x, rec) in ups_a.items():
        noise = rec.symbols - rec.state.gain * x
        # The audit's regeneration: the seed's channel generator, as the runner spawns it.
        rng = experiment_generator(cfg.seed, Stream.CHANNEL, i, t)
        state = params.draw_state(i, x.size, rng)
        regenerated = awgn(x.size, state.noise_var, rng)
        np.testing.assert_array_equal(rec.state.gain, state.gain)  # fading: from the seed
        assert np.mean(np.abs(noise) ** 2) == pytest.approx(state.noise_var, rel=0.2)
        # noise: not from the seed (before the fix these agreed to 1e-16)
        norms = np.linalg.norm(regenerated) * np.linalg.norm(noise)
        assert abs(np.vdot(regenerated, noise)) / norms < 8 / np.sqrt(x.size)
        assert np.linalg.norm(noise - regenerated) > 0.5 * np.linalg.norm(noise)
        # Same seed, second run: the same fading gain, fresh noise.
        x_b, rec_b = ups_b[(i, t)]
        np.testing.assert_array_equal(rec_b.state.gain, rec.state.gain)
        noise_b = rec_b.symbols - rec_b.state.gain * x_b
        assert np.linalg.norm(noise_b - noise) > 0.5 * np.linalg.norm(noise)
    # The accounting needs only what is public to the receiver (h, N0): equal events.
    with (
        Ledger.open(tmp_path / "a" / "ledger.jsonl") as a,
        Ledger.open(tmp_path / "b" / "ledger.jsonl") as b,
    ):
        assert a.events() == b.events()


@pytest.mark.parametrize("link", ["symbol", "waveform"])
def test_links_draw_noise_from_the_csprng_only_where_it_is_credited(
    tiny_overrides: list[str], link: str
) -> None:
    """Credited: the same channel generator gives the same impairments, different noise.
    Not credited (ldp-fedavg): the noise stays reproducible from the seed."""
    hw = load_hardware("sim")
    for scheme, secret in (("channel-dp", True), ("ldp-fedavg", False)):
        cfg = load_experiment(None, [*tiny_overrides, *CREDITED, f"scheme={scheme}",
                                     f"link={link}", "snr_db=15"])
        assert link_noise(cfg, hw).secret is secret
        x = unit_payload(3000, np.random.default_rng(0))
        with make_link(cfg, hw) as lk:
            assert lk.noise_is_secret is secret
            a, b = (lk.transmit(device=1, round_index=2, symbols=x,
                                rng=experiment_generator(0, Stream.CHANNEL, 1, 2)) for _ in "ab")
        assert np.array_equal(a.symbols, b.symbols) is not secret
        if link == "waveform":
            for key in ("cfo_true_hz", "delay_true_samples"):  # seeded impairments
                assert a.info[key] == b.info[key]
        else:
            np.testing.assert_array_equal(a.state.gain, b.state.gain)


def test_the_rule_in_words_and_numbers(tiny_overrides: list[str]) -> None:
    """One rule (testbed.core.channel_credit): scheme and tau ask, the link's noise decides."""
    sim = load_hardware("sim")
    gr = load_experiment(None, [*tiny_overrides, *CREDITED, "link=gnuradio"])
    credit = channel_credit(gr, sim)  # credited: the emulator draws from the CSPRNG
    assert credit.fraction == 1.0 and "OS CSPRNG" in credit.noise.origin
    gr_ldp = load_experiment(None, [*tiny_overrides, *CREDITED, "link=gnuradio",
                                    "scheme=ldp-fedavg"])
    seeded = link_noise(gr_ldp, sim)  # not credited: the fast table, reproducible
    assert not seeded.secret and "noise_seed" in seeded.origin
    sym = load_experiment(None, [*tiny_overrides, *CREDITED])
    assert channel_credit(sym, sim).fraction == 1.0 and credited_config(sym, sim) is sym
    usrp = load_experiment(None, [*tiny_overrides, *CREDITED, "link=usrp"])
    assert channel_credit(usrp, sim).fraction == 1.0  # physical receiver noise
    ldp = load_experiment(None, [*tiny_overrides, *CREDITED, "scheme=ldp-fedavg"])
    assert "does not credit it" in channel_credit(ldp, sim).reason


def test_trust_statement_says_it_once() -> None:
    credited = trust_statement(
        {"credited_fraction": 1.0, "source": "simulated, drawn from the OS CSPRNG",
         "reason": ""}, "record")
    assert "against the aggregator" in credited and "eavesdropper" in credited
    assert "epsilon_no_channel" in credited and "anyone who receives" not in credited
    assert "OS CSPRNG" in credited
    none = trust_statement(
        {"credited_fraction": 0.0, "source": "x", "reason": "the gnuradio link's noise is "
         "seeded"}, "device")
    assert "eavesdroppers included" in none and "No channel noise is credited" in none
    assert none.endswith("the gnuradio link's noise is seeded.")
    assert "epsilon_no_channel" not in none


def test_gnuradio_run_credits_csprng_noise_after_reception(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """A credited run on the GNU Radio emulator: its noise comes from csprng_noise_adder
    (not the seeded fast table), the artificial noise alone meets the target, and the
    noise measured in each received frame is credited afterwards."""
    require_gnuradio()
    cfg = load_experiment(None, [*tiny_overrides, *CREDITED, "link=gnuradio", "rounds=2"])
    with make_link(cfg, load_hardware("sim")) as lk:
        assert lk.noise == "csprng" and lk.noise_is_secret
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == cfg.devices * cfg.rounds
    assert all(e.trusted_channel_noise == 1.0 and e.channel_credited and e.n0 > 0
               for e in events)
    channel = summary["privacy"]["channel_noise"]
    assert channel["credited_fraction"] == 1.0 and channel["secret"]
    assert "csprng_noise_adder" in channel["source"]
    for dev in summary["privacy"]["devices"]:
        assert dev["epsilon_no_channel"] <= 3.0 * (1 + 1e-9)
        assert dev["epsilon"] < dev["epsilon_no_channel"]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert "credited (fraction 1)" in meta["channel_noise_source"]


def test_estimated_link_credits_the_measured_noise_after_reception(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    """Before the fix a credited record-level run on the waveform link ended
    ``budget_exhausted`` at round 0: sigma was calibrated with the credit, the gate before
    transmission (no channel state yet) could count none. Now the noise alone meets the
    target on such links, every event carries the trusted fraction, and the noise measured
    in each received frame is credited afterwards: spent epsilon below the no-channel one."""
    over = [*tiny_overrides, *CREDITED, "link=waveform", "rounds=2"]
    cfg = load_experiment(None, over)
    sim = load_hardware("sim")
    assert calibration_config(cfg, sim).privacy.trusted_channel_noise == 0.0
    assert calibration_config(load_experiment(None, [*tiny_overrides, *CREDITED]), sim) \
        .privacy.trusted_channel_noise == 1.0  # the symbol link knows its state beforehand
    with pytest.raises(ConfigError, match="only from the received frame"):
        calibration_config(cfg.model_copy(update={"plan": "made-for-credit.yaml"}), sim)
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary
    with Ledger.open(tmp_path / "run" / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == cfg.devices * cfg.rounds
    assert all(e.trusted_channel_noise == 1.0 and e.channel_credited and e.n0 > 0
               for e in events)
    for dev in summary["privacy"]["devices"]:
        assert dev["channel_credited"] and dev["trusted_channel_noise"] == 1.0
        assert dev["epsilon_no_channel"] <= 3.0 * (1 + 1e-9)  # the noise alone meets it
        assert dev["epsilon"] < dev["epsilon_no_channel"]  # and the channel's counted too
