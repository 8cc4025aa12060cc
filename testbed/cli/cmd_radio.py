"""``testbed radio probe|check|loopback|calibrate``: find radios, validate hardware configs,
test links, measure a bench.

``probe`` lists the USRPs UHD finds (through ``/usr/bin/python3``); ``check`` validates a
hardware config and builds its flowgraphs without starting them; ``loopback`` sends a known
payload over a link and reports the payload NMSE, the SNR estimate and its confidence
interval, the frequency-offset estimate and the samples lost; ``calibrate`` measures the
config's radios into a calibration the config includes
(:mod:`testbed.cli.cmd_radio_calibrate`).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from radio.flowgraph_process import (
    FLOWGRAPH_DIR,
    SYSTEM_PYTHON,
    FlowgraphError,
    build_flowgraph,
    gnuradio_available,
)
from radio.tdma import BURST_START_JITTER_S, slot_guard_s
from radio.uhd_probe import find_usrps
from radio.virtual_device import is_virtual
from testbed.cli.cmd_radio_calibrate import add_calibrate_parser
from testbed.cli.cmd_radio_loopback import MAX_LOOPBACK_TRIALS, SNR_DB_HELP, cmd_loopback
from testbed.cli.output import emit
from testbed.core.calibration_status import calibration_status
from testbed.core.config.hardware import (
    DeviceRadio,
    HardwareConfig,
    device_radio,
    receiver_radio,
)
from testbed.core.config.link import LINKS
from testbed.core.config.loader import load_hardware
from testbed.core.links import waveform_params

#: N210 master clock; its sample rates are 100 MS/s divided by an integer.
N210_MASTER_CLOCK_HZ = 100e6


def _probe_virtual(hw: HardwareConfig, as_json: bool) -> int:
    """List a virtual config's devices as virtual (UHD is not asked: nothing to discover)."""
    from radio.virtual_device import VirtualArgs
    from testbed.core.config.hardware import usrp_args

    found = []
    for key, dev_args in usrp_args(hw):
        va = VirtualArgs.parse(dev_args)
        found.append({"key": key, "type": "virtual", "serial": va.serial,
                      "clock_offset_s": va.clock_offset_s, "drift_ppm": va.drift_ppm})
    air = hw.virtual_air
    lines = [f"{len(found)} virtual USRP(s) in hardware config '{hw.name}' (no UHD discovery; "
             f"the virtual air takes bursts at {air.burst_address} and streams to the "
             f"receiver from {air.stream_address}: run 'testbed air --hw ...'):"]
    lines += [f"  {d['key']}: type=virtual, serial={d['serial']}, clock offset "
              f"{d['clock_offset_s']:g} s, drift {d['drift_ppm']:g} ppm" for d in found]
    emit({"devices": found, "virtual": True, "uhd_available": None, "message": "",
          "air": {"burst_address": air.burst_address, "stream_address": air.stream_address}},
         as_json, lines)
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """List the USRPs UHD finds (or, with ``--hw`` of a virtual config, its virtual
    devices); none is not an error."""
    if args.hw is not None:
        hw = load_hardware(args.hw)
        if hw.virtual:
            return _probe_virtual(hw, args.json)
    res = find_usrps(args.device_args, python=args.python)
    fallback = ("--fallback emulate (the same processes on virtual USRPs with the hardware "
                "config's parameters), or link gnuradio (GNU Radio channel emulator) or "
                "waveform (numpy emulator)")
    if res.devices:
        lines = [f"found {len(res.devices)} USRP(s):"]
        lines += ["  " + ", ".join(f"{k}={v}" for k, v in d.items()) for d in res.devices]
    elif res.uhd_available:
        lines = [f"no USRP found by UHD; without hardware use {fallback}"]
    else:
        lines = [f"UHD not usable ({res.message}); without hardware use {fallback}"]
    emit(
        {"devices": res.devices, "uhd_available": res.uhd_available, "message": res.message,
         "fallback": ["emulate", "gnuradio", "waveform"]},
        args.json, lines,
    )
    return 0


def _grcc(name: str, outdir: Path) -> str:
    grc = FLOWGRAPH_DIR / f"{name}.grc"
    out = subprocess.run(
        ["grcc", "-o", str(outdir), str(grc)], capture_output=True, text=True, timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise FlowgraphError(f"grcc {grc.name} failed: {(out.stdout + out.stderr).strip()[-400:]}")
    return f"{grc.name} compiles with grcc"


#: Status of a check: passed, failed, or (devices) deliberately not opened.
OK, FAIL, NOT_OPENED = "ok", "FAIL", "not opened"
#: A check that does not fail the config but needs doing (an uncalibrated or stale bench).
WARN = "warn"

#: What stands in for each flowgraph's UHD block when devices are not opened.
_STAND_IN = {"tx": ("uhd.usrp_sink", "null sink"), "rx": ("uhd.usrp_source", "null source")}


def _check_devices(
    hw: HardwareConfig, open_devices: bool
) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    """Device checks of a ``usrp`` config; returns the checks and which roles to open.

    Without ``open_devices`` nothing is asked of UHD (no discovery packet leaves the host).
    """
    checks: list[dict[str, Any]] = []
    opened: dict[str, bool] = {}
    for role, dev_args in (("tx", hw.usrp.tx_args), ("rx", hw.usrp.rx_args)):
        block, stand_in = _STAND_IN[role]
        if not open_devices:
            checks.append(_check(
                f"device {role}", NOT_OPENED,
                f"'{dev_args}': a {stand_in} stands in for {block} in the build "
                "(pass --open-devices to look for the USRP)",
            ))
            opened[role] = False
            continue
        res = find_usrps(dev_args, python=hw.gnuradio.python)
        opened[role] = bool(res.devices)
        if res.devices:
            found = ", ".join(f"{k}={v}" for k, v in res.devices[0].items())
            checks.append(_check(f"device {role}", OK, f"'{dev_args}': found {found}"))
        else:
            why = res.message or "UHD found no device"
            checks.append(_check(f"device {role}", FAIL, f"no USRP found for '{dev_args}' ({why})"))
    return checks, opened


#: Example control-plane offset uncertainty (s) shown by ``check``: half a 1 ms LAN RTT.
_EXAMPLE_UNCERTAINTY_S = 0.5e-3


def _edge_row(r: DeviceRadio, hw: HardwareConfig, open_device: bool) -> dict[str, Any]:
    """One edge device's transmitter: its entry's values, and its USRP when asked."""
    detail = (f"{r.key}: tx '{r.tx_args}', gain {r.tx_gain_db:g} dB, antenna {r.tx_antenna}, "
              f"unit-power stream {r.tx_power_ref_w:g} W <= max {r.max_tx_power_w:g} W")
    if not open_device:
        return _check(f"edge device {r.device}", OK, detail + "; not opened")
    res = find_usrps(r.tx_args, python=hw.gnuradio.python)
    if res.devices:
        found = ", ".join(f"{k}={v}" for k, v in res.devices[0].items())
        return _check(f"edge device {r.device}", OK, f"{detail}; found {found}")
    why = res.message or "UHD found no device"
    return _check(f"edge device {r.device}", FAIL,
                  f"no USRP found for '{r.tx_args}' ({why}); {detail}")


def _edge_checks(
    hw: HardwareConfig, device: int | None, open_devices: bool
) -> tuple[list[dict[str, Any]], DeviceRadio | None]:
    """The lab split's checks: each device's transmitter, the set of them, the TDMA guard.

    Entries are validated when the config loads (ids and USRPs distinct, none the receiver,
    power within each radio's maximum); these rows show the result. Only ``device`` (this
    host's, with ``--device``) is ever looked for, and only with ``open_devices``.
    """
    u = hw.usrp
    if device is not None:
        r = device_radio(hw, device)
        return [_edge_row(r, hw, open_devices)], r
    rows = [_edge_row(device_radio(hw, e.device), hw, False) for e in u.devices]
    ids = sorted(e.device for e in u.devices)
    if not ids:
        rows.append(_check("edge devices", OK, (
            f"no usrp.devices: usrp.tx_args '{u.tx_args}' serves the single-process link "
            "and an edge with --device-id 0 only; list one entry per device for the lab split")))
    else:
        gaps = sorted(set(range(ids[-1] + 1)) - set(ids))
        note = (f"; no entry for device(s) {', '.join(map(str, gaps))} (their edges refuse "
                "to start)") if gaps else ""
        rows.append(_check("edge devices", OK, (
            f"{len(ids)} devices (ids {', '.join(map(str, ids))}), each with its own USRP, "
            f"none the receiver '{u.rx_args}'{note}; on device host I: testbed radio check "
            "CONFIG --device I --open-devices")))
    guard = slot_guard_s(_EXAMPLE_UNCERTAINTY_S, u.time_source)
    if u.time_source in ("external", "mimo", "gpsdo"):
        text = (f"time_source {u.time_source}: shared reference, every USRP latches the host's "
                f"second at a PPS edge; fixed guard {1e3 * guard:.2f} ms per side")
    else:
        text = (f"time_source {u.time_source}: no shared reference; guard >= 2 x control-plane "
                f"offset uncertainty + {1e3 * BURST_START_JITTER_S:.2f} ms jitter "
                f"({1e3 * guard:.2f} ms at a 1 ms RTT)")
    rows.append(_check("tdma guard", OK, text))
    status = calibration_status(hw, "usrp")
    rows.append(_check("radio calibration", OK if status.state == "current" else WARN,
                       status.line))
    return rows, None


def _check(what: str, status: str, detail: str) -> dict[str, Any]:
    """One check result; ``ok`` is ``None`` for a device deliberately not opened."""
    return {"check": what, "status": status, "ok": {OK: True, FAIL: False}.get(status),
            "detail": detail}


def _build_check(
    name: str, args: list[str], hw: HardwareConfig, device_opened: bool
) -> dict[str, Any]:
    """Build one flowgraph (``--build-only``) and check it made UHD blocks only if asked."""
    try:
        out = build_flowgraph(FLOWGRAPH_DIR / f"{name}.py", args, python=hw.gnuradio.python)
    except FlowgraphError as exc:
        return _check(f"build {name}", FAIL, str(exc))
    line = out.splitlines()[-1] if out else "built"
    if name in _STAND_IN and not device_opened and (
        "UHD blocks: none" not in line or "uhd imported: no" not in line
    ):
        return _check(f"build {name}", FAIL,
                      f"UHD touched although devices were not to be opened: {line}")
    return _check(f"build {name}", OK, line)


def cmd_check(args: argparse.Namespace) -> int:
    """Validate a hardware config and build (not start) its flowgraphs.

    UHD blocks are built only with ``--open-devices``; otherwise a null sink/source stands
    in for each (``gnuradio.uhd`` is not even imported) and the devices are reported as
    ``not opened``. With ``--open-devices`` a device that is not found fails the check.
    """
    hw = load_hardware(args.hw_config)
    checks: list[dict[str, Any]] = []
    try:
        wf = waveform_params(hw)
        checks.append(_check("waveform", OK,
                             f"{wf.sample_rate_hz:.0f} S/s, {wf.samples_per_symbol} sps"))
    except ValueError as exc:
        checks.append(_check("waveform", FAIL, str(exc)))
        wf = None
    if hw.link == "usrp" and wf is not None:
        decim = N210_MASTER_CLOCK_HZ / wf.sample_rate_hz
        ok = abs(decim - round(decim)) < 1e-9
        checks.append(_check("sample_rate", OK if ok else FAIL,
                             f"100 MS/s / {decim:g}" + ("" if ok else " is not an integer")))
    opened: dict[str, bool] = {}
    edge: DeviceRadio | None = None
    if hw.link == "usrp" and args.device is None:
        device_checks, opened = _check_devices(hw, args.open_devices)
        checks += device_checks
    if hw.link == "usrp" or args.device is not None:
        edge_rows, edge = _edge_checks(hw, args.device, args.open_devices and hw.link == "usrp")
        checks += edge_rows
        if edge is not None:
            opened["tx"] = args.open_devices and edge_rows[0]["status"] == OK
    ok_gr, version = gnuradio_available(hw.gnuradio.python)
    checks.append(_check("gnuradio", OK if ok_gr else FAIL, version))
    if ok_gr and wf is not None:
        names = ["channel_emulator"] + (["tx", "rx"] if hw.link == "usrp" else [])
        u = hw.usrp
        tx_args, tx_gain = (u.tx_args, u.tx_gain_db) if edge is None else (
            edge.tx_args, edge.tx_gain_db)
        # A virtual device's flowgraph is built with its air's address (nothing connects
        # until it runs): the burst address for a transmitter, the stream's for the receiver.
        tx_air = hw.virtual_air.burst_address if is_virtual(tx_args) else ""
        rx_air = receiver_radio(hw).air_address
        extra = {
            "channel_emulator": ["--samp-rate", repr(wf.sample_rate_hz)],
            "tx": ["--samp-rate", repr(wf.sample_rate_hz), "--device-args", tx_args,
                   "--center-freq", repr(hw.center_freq_hz), "--gain", repr(tx_gain),
                   *(["--air-address", tx_air] if tx_air else [])],
            "rx": ["--samp-rate", repr(wf.sample_rate_hz), "--device-args", u.rx_args,
                   "--center-freq", repr(hw.center_freq_hz), "--gain", repr(u.rx_gain_db),
                   *(["--air-address", rx_air] if rx_air else [])],
        }
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                device = opened.get(name, False)
                flags = ["--open-device"] if device else []
                checks.append(_build_check(name, extra[name] + flags, hw, device))
                try:
                    checks.append(_check(f"grc {name}", OK, _grcc(name, Path(tmp))))
                except (FlowgraphError, OSError, subprocess.TimeoutExpired) as exc:
                    checks.append(_check(f"grc {name}", FAIL, str(exc)))
    ok_all = all(c["status"] != FAIL for c in checks)
    lines = [f"hardware config '{hw.name}' (link {hw.link}):"]
    lines += [f"  [{c['status']}] {c['check']}: {c['detail']}" for c in checks]
    dev_args = {"tx": hw.usrp.tx_args, "rx": hw.usrp.rx_args}
    missing = [f"{role} ('{dev_args[role]}')" for role in dev_args
               if any(c["check"] == f"device {role}" and c["status"] == FAIL for c in checks)]
    if edge is not None and any(c["check"] == f"edge device {edge.device}"
                                and c["status"] == FAIL for c in checks):
        missing.append(f"device {edge.device} ('{edge.tx_args}')")
    if missing:
        lines.append(f"no device found: no USRP for {', '.join(missing)} "
                     "(see 'testbed radio probe')")
    elif any(c["status"] == NOT_OPENED for c in checks):
        lines.append("devices not opened; pass --open-devices to look for the USRPs")
    emit({"hw_config": hw.name, "link": hw.link, "ok": ok_all, "checks": checks,
          "devices_opened": bool(args.open_devices), "device": args.device},
         args.json, lines)
    return 0 if ok_all else 1


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``testbed radio`` and its subcommands."""
    radio = subparsers.add_parser("radio", help="find radios, check hw configs, test links",
                                  description=__doc__)
    sub = radio.add_subparsers(dest="radio_command", metavar="SUBCOMMAND")
    radio.set_defaults(func=lambda a: (radio.print_help(), 2)[1])

    p = sub.add_parser("probe", help="list USRPs found by UHD")
    p.add_argument("--device-args", default="", help="UHD device args filter (default: all)")
    p.add_argument("--python", default=SYSTEM_PYTHON, help="interpreter with UHD")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--hw", metavar="HW_CONFIG",
                   help="a hardware config: its virtual devices are listed as virtual "
                   "(no UHD discovery); a real config probes --device-args as without it")
    p.set_defaults(func=cmd_probe)

    c = sub.add_parser("check", help="validate a hardware config and build its flowgraphs")
    c.add_argument("hw_config", metavar="HW_CONFIG", help="name in hw_configs/ or a YAML path")
    c.add_argument(
        "--open-devices", action="store_true",
        help="look for the config's USRPs (UHD discovery: sends packets to the device "
        "addresses) and build tx/rx with them; default: null blocks stand in, no UHD call",
    )
    c.add_argument(
        "--device", type=int, default=None, metavar="I",
        help="check device I's usrp.devices entry only (run on device host I; with "
        "--open-devices looks for its USRP alone and builds tx with its args)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_check)

    lb = sub.add_parser("loopback", help="send a known payload over a link")
    lb.add_argument("--link", required=True, choices=LINKS)
    lb.add_argument("--snr-db", type=float, default=None, help=SNR_DB_HELP)
    lb.add_argument("--cfo-hz", type=float, default=0.0,
                    help="carrier frequency offset (Hz); links waveform and gnuradio only")
    lb.add_argument("--delay-samples", type=float, default=None,
                    help="maximum random leading delay (samples); links waveform and "
                    "gnuradio only")
    lb.add_argument("--hw", default="sim", help="hardware config (default: sim)")
    lb.add_argument("--n-symbols", type=int, default=10920, help="payload symbols")
    lb.add_argument("--trials", type=int, default=1,
                    help=f"uploads to average over (1 .. {MAX_LOOPBACK_TRIALS})")
    lb.add_argument("--seed", type=int, default=0, help="payload and channel seed")
    lb.add_argument("--json", action="store_true", help="print one JSON object")
    lb.set_defaults(func=cmd_loopback)

    add_calibrate_parser(sub)
