"""Checks of a control-plane message's field values (:mod:`testbed.core.transport.protocol`): kinds,
ranges, the payload length a header announces, the ``tx_report`` of an on-air upload and the
sizes and shapes of the secure-aggregation (``sa_*``) messages. Each raises
:class:`~testbed.core.transport.protocol_schema.ProtocolError`."""

from __future__ import annotations

import math
from typing import Any

from testbed.core.secagg import MIN_DEVICES
from testbed.core.transport.protocol_schema import (
    AIRCOMP_ROUND_KEYS,
    BOOL,
    DICT,
    FLOAT,
    INT,
    LIST,
    MAX_AIRTIME_S,
    MAX_DEVICE,
    MAX_LIST,
    MAX_PARAMS,
    MAX_ROUND,
    MAX_SLACK_S,
    MAX_STR,
    MAX_SYMBOLS,
    MAX_TIMING_UNCERTAINTY_S,
    MAX_TX_POWER_W,
    OPT,
    PAYLOADS,
    SECAGG_CIPHERTEXT_HEX,
    SECAGG_KEY_HEX,
    SECAGG_NONCE_HEX,
    SECAGG_ORDINATE_HEX,
    STR,
    TX_REPORT_KEYS,
    ProtocolError,
)


def kind_ok(value: Any, kind: str) -> bool:
    """Whether ``value`` is of the schema ``kind``
    (:data:`~testbed.core.transport.protocol_schema.INT`,
    ``FLOAT`` (finite), ``STR`` (at most ``MAX_STR`` long), ``BOOL``, ``DICT``, ``LIST`` (at
    most ``MAX_LIST`` items); with the suffix ``OPT`` also ``None``)."""
    if kind.endswith(OPT):
        if value is None:
            return True
        kind = kind[:-1]
    if kind == INT:
        return type(value) is int
    if kind == FLOAT:
        return type(value) in (int, float) and value == value and abs(value) != float("inf")
    if kind == STR:
        return isinstance(value, str) and len(value) <= MAX_STR
    if kind == BOOL:
        return type(value) is bool
    if kind == DICT:
        return isinstance(value, dict)
    if kind == LIST:
        return isinstance(value, list) and len(value) <= MAX_LIST
    raise AssertionError(kind)


def payload_bytes(msg_type: str, fields: dict[str, Any]) -> int | None:
    """The byte length the binary payload of a ``msg_type`` message must have, from its
    ``fields`` (``None``: the message carries no payload)."""
    kind = PAYLOADS[msg_type]
    if kind in ("float64", "uint64"):
        return 8 * int(fields["d"])
    if kind == "complex128":
        return 0 if fields.get("on_air") else 16 * int(fields["n_symbols"])
    return None


def check_ranges(msg_type: str, fields: dict[str, Any]) -> None:
    """Check the numeric fields of a ``msg_type`` message against their ranges; raises
    :class:`ProtocolError` on the first out of range."""
    if not 0 <= fields["device"] <= MAX_DEVICE:
        raise ProtocolError(f"{msg_type}: device {fields['device']} outside [0, {MAX_DEVICE}]")
    if "round" in fields and not 0 <= fields["round"] <= MAX_ROUND:
        raise ProtocolError(f"{msg_type}: round {fields['round']} outside [0, {MAX_ROUND}]")
    if "d" in fields and not 1 <= fields["d"] <= MAX_PARAMS:
        raise ProtocolError(f"{msg_type}: d {fields['d']} outside [1, {MAX_PARAMS}]")
    if "n_symbols" in fields and not 0 <= fields["n_symbols"] <= MAX_SYMBOLS:
        raise ProtocolError(f"{msg_type}: n_symbols {fields['n_symbols']} too large")
    for key in ("next_round", "slot", "dataset_size"):
        if key in fields and not 0 <= fields[key] <= MAX_ROUND:
            raise ProtocolError(f"{msg_type}: {key} {fields[key]} outside [0, {MAX_ROUND}]")
    if "deadline_s" in fields and not 0 < fields["deadline_s"] <= 86400:
        raise ProtocolError(f"{msg_type}: deadline_s {fields['deadline_s']} outside (0, 86400]")
    if "nonce" in fields and not (0 < len(fields["nonce"]) <= 128):
        raise ProtocolError(f"{msg_type}: nonce of length {len(fields['nonce'])}")
    if fields.get("tx_time_s") is not None and fields["tx_time_s"] < 0:
        raise ProtocolError(f"{msg_type}: tx_time_s {fields['tx_time_s']} is negative")
    if msg_type == "upload":
        _check_tx_report(fields["on_air"], fields["tx_report"])
    if msg_type == "round" and fields["aircomp"] is not None:
        _check_aircomp(fields["aircomp"])
    if msg_type == "ready" and not all(isinstance(n, str) for n in fields["nonces"]):
        raise ProtocolError("ready: nonces must be strings")
    if msg_type in ("sync", "finished"):
        for item in fields["events"]:
            if not (
                isinstance(item, dict)
                and set(item) == {"nonce", "event"}
                and isinstance(item["nonce"], str)
                and isinstance(item["event"], dict)
            ):
                raise ProtocolError(f"{msg_type}: events must be {{nonce: str, event: dict}} items")
    if msg_type.startswith("sa_"):
        _check_secagg(msg_type, fields)


def _hex(value: Any, n: int) -> bool:
    """``value`` is exactly ``n`` lower-case hex digits."""
    return (isinstance(value, str) and len(value) == n
            and all(c in "0123456789abcdef" for c in value))


def _device_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_DEVICE


def _items(msg_type: str, key: str, items: list[Any], schema: dict[str, Any]) -> None:
    """Every item of ``items`` is a mapping with exactly ``schema``'s keys, each value
    passing its check (a hex length or ``"device"``)."""
    for item in items:
        if not isinstance(item, dict) or set(item) != set(schema):
            raise ProtocolError(f"{msg_type}: {key} items must have exactly {sorted(schema)}")
        for name, want in schema.items():
            ok = _device_id(item[name]) if want == "device" else _hex(item[name], want)
            if not ok:
                raise ProtocolError(f"{msg_type}: {key}.{name} is not a valid "
                                    f"{'device id' if want == 'device' else f'{want}-digit hex'}")


def _device_set(msg_type: str, key: str, values: list[Any]) -> set[int]:
    if not all(_device_id(v) for v in values) or len(set(values)) != len(values):
        raise ProtocolError(f"{msg_type}: {key} must be distinct device ids")
    return set(values)


def _check_secagg(msg_type: str, fields: dict[str, Any]) -> None:
    """Sizes and shapes of the secure-aggregation messages (their meaning is checked where
    they are turned into :mod:`testbed.core.secagg` objects)."""
    me = fields["device"]
    if msg_type == "sa_keys":
        for key in ("mask_public", "channel_public"):
            if not _hex(fields[key], SECAGG_KEY_HEX):
                raise ProtocolError(f"sa_keys: {key} is not {SECAGG_KEY_HEX} hex digits")
    elif msg_type == "sa_roster":
        keys = fields["keys"]
        _items(msg_type, "keys", keys, {"device": "device", "mask_public": SECAGG_KEY_HEX,
                                        "channel_public": SECAGG_KEY_HEX})
        members = _device_set(msg_type, "keys", [k["device"] for k in keys])
        if len(members) < MIN_DEVICES or me not in members:
            raise ProtocolError(f"sa_roster: must list at least {MIN_DEVICES} devices, "
                                "its recipient among them")
        if not 2 <= fields["threshold"] <= len(members) - 1:
            raise ProtocolError(f"sa_roster: threshold {fields['threshold']} outside "
                                f"[2, {len(members) - 1}]")
    elif msg_type in ("sa_shares", "sa_inbox"):
        peer = "recipient" if msg_type == "sa_shares" else "sender"
        shares = fields["shares"]
        _items(msg_type, "shares", shares, {peer: "device", "nonce": SECAGG_NONCE_HEX,
                                            "ciphertext": SECAGG_CIPHERTEXT_HEX})
        peers = _device_set(msg_type, f"shares.{peer}", [s[peer] for s in shares])
        if me in peers:
            raise ProtocolError(f"{msg_type}: a device shares nothing with itself")
        if msg_type == "sa_inbox":
            members = _device_set(msg_type, "participants", fields["participants"])
            if me not in members or not peers <= members:
                raise ProtocolError("sa_inbox: participants must hold the recipient and "
                                    "every sender")
    elif msg_type == "sa_unmask_req":
        got = _device_set(msg_type, "received", fields["received"])
        dropped = _device_set(msg_type, "dropped", fields["dropped"])
        if me not in got or got & dropped:
            raise ProtocolError("sa_unmask_req: received must hold the recipient and be "
                                "disjoint from dropped")
    elif msg_type == "sa_unmask":
        owners: list[set[int]] = []
        for key in ("self_mask_shares", "mask_key_shares"):
            for item in fields[key]:
                if not (isinstance(item, list) and len(item) == 3 and _device_id(item[0])
                        and type(item[1]) is int and 1 <= item[1] <= MAX_DEVICE + 1
                        and _hex(item[2], SECAGG_ORDINATE_HEX)):
                    raise ProtocolError(f"sa_unmask: {key} items must be [owner, x, "
                                        f"{SECAGG_ORDINATE_HEX}-digit hex y]")
            owners.append(_device_set(msg_type, f"{key} owners", [i[0] for i in fields[key]]))
        if owners[0] & owners[1]:
            raise ProtocolError("sa_unmask: no owner's self-mask seed and mask key both")


def _check_aircomp(part: dict[str, Any]) -> None:
    """A ``round``'s ``aircomp``: exactly :data:`AIRCOMP_ROUND_KEYS`, finite floats, the
    amplitude and signal power > 0."""
    if set(part) != set(AIRCOMP_ROUND_KEYS):
        raise ProtocolError(f"round: aircomp must have exactly {sorted(AIRCOMP_ROUND_KEYS)}")
    for key in AIRCOMP_ROUND_KEYS:
        value = part[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise ProtocolError(f"round: aircomp.{key} must be a finite number")
    if not (part["amplitude"] > 0 and part["signal_power"] > 0):
        raise ProtocolError("round: aircomp.amplitude and signal_power must be > 0")


def _check_tx_report(on_air: bool, report: dict[str, Any] | None) -> None:
    """An on-air upload carries exactly :data:`TX_REPORT_KEYS`, each in range; else null."""
    if not on_air:
        if report is not None:
            raise ProtocolError("upload: tx_report must be null unless on_air is true")
        return
    if report is None:
        raise ProtocolError("upload: on_air is true but tx_report is null")
    if set(report) != set(TX_REPORT_KEYS):
        missing = sorted(set(TX_REPORT_KEYS) - set(report))
        extra = sorted(set(report) - set(TX_REPORT_KEYS))
        raise ProtocolError(f"upload: tx_report missing {missing}, unknown {extra}")
    for key in TX_REPORT_KEYS:
        if not kind_ok(report[key], FLOAT):
            raise ProtocolError(f"upload: tx_report.{key} is not a valid {FLOAT}")
    bounds = {
        "airtime_s": (0.0, MAX_AIRTIME_S),
        "tx_power_w": (0.0, MAX_TX_POWER_W),
        "timing_uncertainty_s": (0.0, MAX_TIMING_UNCERTAINTY_S),
        "slack_s": (-MAX_SLACK_S, MAX_SLACK_S),
    }
    for key, (low, high) in bounds.items():
        if not low <= report[key] <= high:
            raise ProtocolError(
                f"upload: tx_report.{key} {report[key]} outside [{low:g}, {high:g}]"
            )
    if report["airtime_s"] == 0:
        raise ProtocolError("upload: tx_report.airtime_s must be > 0")
