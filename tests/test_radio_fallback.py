"""The emulation fallback's decisions and the emulated config it derives (no processes).

Checked against independent computations: the radiated power from the virtual device's own
power model, the mean Es/N0 from the link budget's own formula, the Doppler from v f / c.
Hardware configs are copies of the lab's with every address on the loopback
(:func:`bench_copy`): UHD discovery never reaches a lab address from a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.outcome import outcome_line
from radio.link_budget import budget_snr_db, path_gain
from radio.uhd_probe import ProbeResult, check_loopback_only
from radio.virtual_device import VirtualArgs
from testbed.core.config.emulated import EMULATED_LABEL
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_hardware
from testbed.core.radio_fallback import (
    VIRTUAL_BURST_LEAD_S,
    FallbackRefused,
    check_same_radios,
    emulation_facts,
    fallback_mode,
    radios_of,
    resolve_radios,
)

ROOT = Path(__file__).resolve().parents[1]


def bench_copy(tmp_path: Path, name: str) -> Path:
    """``hw_configs/<name>.yaml`` with its 192.168.10.x addresses on 127.0.0.x."""
    text = (ROOT / "hw_configs" / f"{name}.yaml").read_text().replace("192.168.10.", "127.0.0.")
    assert "192.168" not in text
    path = tmp_path / f"{name}_loopback.yaml"
    path.write_text(text)
    return path


class FakeProbe:
    """UHD discovery that finds exactly the args in ``present``; records what it was asked."""

    def __init__(self, present: set[str] = frozenset(), uhd: bool = True) -> None:  # type: ignore[assignment]
        self.present, self.uhd, self.asked = set(present), uhd, []  # type: list[str]

    def __call__(self, args: str, python: str = "") -> ProbeResult:
        self.asked.append(args)
        if not self.uhd:
            return ProbeResult([], False, "UHD is not usable under /usr/bin/python3: no uhd")
        found = [{"type": "usrp2", "addr": args.split("=")[1]}] if args in self.present else []
        return ProbeResult(found, True)


def _launch_radios(hw: Any, n: int = 4) -> list[tuple[str, str]]:
    return radios_of(hw, "launch", devices=n)


@pytest.mark.parametrize("name", ["lab_ota", "darkroom"])
def test_none_found_gives_the_configs_radios_virtual(tmp_path: Path, name: str) -> None:
    """Every radio becomes a virtual USRP that radiates the config's reference power at its
    gain and amplitude, within its maximum; each path's mean Es/N0 is the experiment's
    snr_db for that device; the clocks follow the config."""
    hw = load_hardware(str(bench_copy(tmp_path, name)))
    probe = FakeProbe()
    snr = [21.0, 18.0, 15.0, 12.0]
    em = resolve_radios(hw, "emulate", _launch_radios(hw), snr_db=snr, probe=probe)
    assert probe.asked == ["addr=127.0.0.3"] + [f"addr=127.0.0.1{i + 1}" for i in range(4)]
    assert em.virtual and em.usrp.emulated is not None
    assert em.usrp.emulated.hardware == name
    assert em.usrp.emulated.missing == [
        "usrp.rx_args = 'addr=127.0.0.3'",
        *[f"usrp.devices[{i}].tx_args = 'addr=127.0.0.1{i + 1}'" for i in range(4)],
    ]
    assert em.usrp.burst_lead_s == max(hw.usrp.burst_lead_s, VIRTUAL_BURST_LEAD_S)
    sps = hw.waveform.samples_per_symbol
    for entry, orig in zip(em.usrp.devices, hw.usrp.devices, strict=True):
        va = VirtualArgs.parse(entry.tx_args)
        assert va.serial == f"edge{entry.device}"
        # The virtual sink's model: x = s sqrt(full_scale 10^(g/10)); a unit-power symbol
        # stream is s of power tx_amplitude^2 / sps per sample.
        radiated = hw.usrp.tx_amplitude**2 / sps * va.tx_full_scale_w * 10 ** (orig.tx_gain_db / 10)
        assert radiated == pytest.approx(hw.tx_power_ref_w, rel=1e-6)
        assert va.max_power_w == orig.max_tx_power_w
        assert entry.tx_gain_db == orig.tx_gain_db
        # Free-running clocks drift (lab_ota: internal); a shared 10 MHz does not (darkroom).
        assert (va.drift_ppm != 0) == (hw.usrp.clock_source == "internal")
        path = em.virtual_air.path(va.serial)
        assert path is not None
        p_rx = hw.tx_power_ref_w * path_gain(attenuation_db=path.attenuation_db)
        got = budget_snr_db(p_rx, hw.symbol_rate_hz, em.virtual_air.temperature_k,
                            em.virtual_air.noise_figure_db)
        assert got == pytest.approx(snr[entry.device], abs=1e-4)
    assert VirtualArgs.parse(em.usrp.rx_args).drift_ppm == 0
    assert (em.symbol_rate_hz, em.center_freq_hz, em.usrp.time_source) == (
        hw.symbol_rate_hz, hw.center_freq_hz, hw.usrp.time_source)


def test_darkroom_keeps_its_fading_and_reports_the_doppler(tmp_path: Path) -> None:
    """The darkroom's Rayleigh profile at 20 km/h, 915 MHz: fD = v f / c = 16.96 Hz."""
    hw = load_hardware(str(bench_copy(tmp_path, "darkroom")))
    em = resolve_radios(hw, "emulate", _launch_radios(hw), snr_db=[20.0] * 4,
                        probe=FakeProbe())
    assert (em.virtual_air.fading, em.virtual_air.speed_kmh) == ("rayleigh", 20.0)
    facts = emulation_facts(em)
    assert facts is not None and facts["label"] == EMULATED_LABEL
    assert facts["doppler_hz"] == pytest.approx(20 / 3.6 * 915e6 / 299_792_458.0, rel=1e-9)
    assert facts["fading"] == "rayleigh" and facts["speed_kmh"] == 20.0
    lab = load_hardware(str(bench_copy(tmp_path, "lab_ota")))  # a room: static paths
    em_lab = resolve_radios(lab, "emulate", _launch_radios(lab), probe=FakeProbe())
    assert em_lab.virtual_air.fading == "none"
    assert emulation_facts(em_lab)["doppler_hz"] == 0.0  # type: ignore[index]
    assert emulation_facts(lab) is None
    rician = load_hardware(str(bench_copy(tmp_path, "darkroom")), ["fading=rician"])
    em_r = resolve_radios(rician, "emulate", _launch_radios(rician), rician_k_db=6.0,
                          probe=FakeProbe())
    assert (em_r.virtual_air.fading, em_r.virtual_air.rician_k_db) == ("rician", 6.0)
    still = load_hardware(str(bench_copy(tmp_path, "darkroom")), ["waveform.speed_kmh=0"])
    with pytest.raises(ValueError, match="waveform.speed_kmh: got 0.0 with fading rayleigh"):
        resolve_radios(still, "emulate", _launch_radios(still), probe=FakeProbe())


def test_all_found_keeps_the_real_radios_and_none_never_looks(tmp_path: Path) -> None:
    hw = load_hardware(str(bench_copy(tmp_path, "lab_ota")))
    wanted = _launch_radios(hw)
    every = FakeProbe({args for _, args in wanted})
    assert resolve_radios(hw, "emulate", wanted, probe=every) is hw
    never = FakeProbe()
    assert resolve_radios(hw, "none", wanted, probe=never) is hw and never.asked == []
    assert resolve_radios(hw, "emulate", [], probe=never) is hw and never.asked == []


def test_a_partial_find_is_refused_naming_the_missing(tmp_path: Path) -> None:
    hw = load_hardware(str(bench_copy(tmp_path, "lab_ota")))
    wanted = _launch_radios(hw)
    probe = FakeProbe({"addr=127.0.0.3", "addr=127.0.0.11"})
    with pytest.raises(FallbackRefused) as err:
        resolve_radios(hw, "emulate", wanted, probe=probe)
    msg = str(err.value)
    assert "usrp.devices[1].tx_args = 'addr=127.0.0.12'" in msg
    assert "usrp.devices[3].tx_args = 'addr=127.0.0.14'" in msg
    assert "found usrp.rx_args = 'addr=127.0.0.3'" in msg and "do not mix" in msg


def test_uhd_missing_counts_as_none_found_and_says_why(tmp_path: Path) -> None:
    hw = load_hardware(str(bench_copy(tmp_path, "lab_ota")))
    em = resolve_radios(hw, "emulate", radios_of(hw, "run"), probe=FakeProbe(uhd=False))
    assert em.usrp.emulated is not None and "UHD is not usable" in em.usrp.emulated.uhd


def test_each_process_looks_for_its_own_radios(tmp_path: Path) -> None:
    hw = load_hardware(str(bench_copy(tmp_path, "lab_ota")))
    assert radios_of(hw, "run") == [("usrp.tx_args", "addr=127.0.0.2"),
                                    ("usrp.rx_args", "addr=127.0.0.3")]
    assert radios_of(hw, "aggregator") == [("usrp.rx_args", "addr=127.0.0.3")]
    assert radios_of(hw, "edge", device=2) == [("usrp.devices[2].tx_args", "addr=127.0.0.13")]
    assert len(radios_of(hw, "launch", devices=2)) == 3


def test_fallback_setting_and_its_errors(tmp_path: Path) -> None:
    copy = bench_copy(tmp_path, "lab_ota")
    hw = load_hardware(str(copy))
    assert fallback_mode(hw, None) == "none"
    assert fallback_mode(hw, "emulate") == "emulate"
    on = load_hardware(str(copy), ["usrp.fallback=emulate"])
    assert fallback_mode(on, None) == "emulate" and fallback_mode(on, "none") == "none"
    with pytest.raises(ConfigError, match="usrp.fallback"):
        load_hardware(str(copy), ["usrp.fallback=maybe"])
    with pytest.raises(ValueError, match="--fallback: got 'maybe'"):
        fallback_mode(hw, "maybe")


def test_edges_refuse_to_mix_real_and_virtual_radios(tmp_path: Path) -> None:
    real = load_hardware(str(bench_copy(tmp_path, "lab_ota")))
    em = resolve_radios(real, "emulate", radios_of(real, "run"), probe=FakeProbe())
    check_same_radios("usrp", real)
    check_same_radios("emulated", em)
    check_same_radios("virtual", em)
    check_same_radios("", real)  # not a usrp run: nothing to compare
    with pytest.raises(ValueError, match="a real USRP but the aggregator's is emulated radios"):
        check_same_radios("emulated", real)
    with pytest.raises(ValueError, match="emulated radios .* but the aggregator's is a real"):
        check_same_radios("usrp", em)


def test_the_outcome_line_says_emulated() -> None:
    summary = {"status": "completed", "radios": EMULATED_LABEL, "rounds_completed": 2,
               "rounds_planned": 2, "final_accuracy": 0.5, "privacy": {"devices": []},
               "wall_time_s": 1.0}
    assert outcome_line(summary, "run").startswith(
        "run completed on emulated radios (no USRP found): 2/2 rounds")


def test_loopback_discovery_accepts_any_127_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_UHD_LOOPBACK_ONLY", "1")
    for ok in ("addr=127.0.0.1", "addr=127.0.0.14", "addr=localhost", "type=b200"):
        check_loopback_only(ok)
    for bad in ("addr=192.168.10.2", "addr=128.0.0.1", "", "addr=127.0.0.1.5"):
        with pytest.raises(RuntimeError, match="refused"):
            check_loopback_only(bad)
