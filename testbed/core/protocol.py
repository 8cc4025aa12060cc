"""Control-plane messages shared by edge devices and the aggregator.

Only side information travels here; model-update values travel over the link as analog
symbols. The exception is 002's secure aggregation (``sa_*``): masked integers cannot cross
an analog channel, so they travel here, masked. This module imports nothing else of the
project.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class UploadHeader:
    """Side information of one upload, sent on the control plane.

    Attributes
    ----------
    device, round_index
        Who and when.
    d
        Model size (length of the differential).
    n_values
        Real values carried by the symbols (``l`` when sparsified, else ``d``).
    alpha
        Power scaling applied to the values before the air (``x = alpha * values``).
    sparsified
        Whether the values sit at the mask positions derived from (run secret, device,
        round) and are scaled by ``d / l``.
    quant_levels
        Q when the values were stochastically quantized, else ``None``.
    quant_norm
        The quantizer's scale (l2 norm of the sparse vector, 003 eq. 7), else ``None``.
    transmitted
        ``False`` when the device sat the round out (budget exhausted); no symbols follow.
    """

    device: int
    round_index: int
    d: int
    n_values: int
    alpha: float
    sparsified: bool = False
    quant_levels: int | None = None
    quant_norm: float | None = None
    transmitted: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UploadHeader:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        return cls(**data)


# --- Control-plane messages between the aggregator and the edge agents -------------------
#
# A message is a multipart ZeroMQ message: one JSON header frame, then at most one binary
# payload frame (little-endian float64 model weights, complex128 symbols, or a masked
# update's uint64 residues; an upload whose symbols went over the radio carries an empty
# one). Everything is validated on receipt: version, type, the exact set of fields and their
# kinds, sizes, and that the payload has the length the header announces. A message that
# fails raises :class:`ProtocolError`; the receiver logs and drops it and keeps serving.

#: Version of the message format; a peer speaking another one is refused. 2: ``round``
#: carries ``tx_time_s``, ``upload`` carries ``on_air`` and ``tx_report``; ``clock_req`` and
#: ``clock`` (the split ``usrp`` link's control-plane clock offset). 3: ``round`` carries
#: ``mechanism`` (the aggregator's privacy event of the upload); the ``sa_*`` messages of
#: 002's secure aggregation.
PROTOCOL_VERSION = 3
#: Largest control-plane message either side accepts (bytes); libzmq drops larger ones
#: before they are read. An upload of d parameters is 8 d bytes (d/2 complex symbols), a
#: model 8 d bytes: models up to about 8 million parameters.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Largest JSON header accepted (bytes).
MAX_HEADER_BYTES = 4 * 1024 * 1024
#: Largest model accepted (parameters); bounds payload allocations.
MAX_PARAMS = 50_000_000
#: Largest upload accepted (complex symbols).
MAX_SYMBOLS = 50_000_000
#: Largest device id / round index accepted.
MAX_DEVICE = 1_000_000
MAX_ROUND = 100_000_000
#: Largest burst air time (s) and timing uncertainty (s) a ``tx_report`` may state.
MAX_AIRTIME_S = 3600.0
MAX_TIMING_UNCERTAINTY_S = 1.0
#: Largest mean burst power (W) a ``tx_report`` may state (the hardware config's bound).
MAX_TX_POWER_W = 100.0
#: Fields of an ``upload``'s ``tx_report`` (what the edge's transmitter did; seconds, watts).
TX_REPORT_KEYS = ("airtime_s", "tx_power_w", "tx_time_usrp_s", "timing_uncertainty_s")
#: Secure aggregation (:mod:`testbed.core.secagg`) on the wire, in lower-case hex digits:
#: an X25519 public key (32 bytes), an AES-GCM nonce (12 bytes), an encrypted pair of Shamir
#: ordinates (2 x 66 bytes plus the 16-byte tag) and one Shamir ordinate (66 bytes).
SECAGG_KEY_HEX = 64
SECAGG_NONCE_HEX = 24
SECAGG_CIPHERTEXT_HEX = 296
SECAGG_ORDINATE_HEX = 132
#: Fewest devices a secure-aggregation roster lists.
SECAGG_MIN_DEVICES = 3

_INT = "int"
_FLOAT = "float"
_STR = "str"
_BOOL = "bool"
_DICT = "dict"
_LIST = "list"
_OPT = "?"  # suffix: the field may be null


class ProtocolError(ValueError):
    """A message that does not follow the protocol (it is dropped, never acted on)."""


#: Field kinds of each message type; every field is required, no other field is allowed.
SCHEMAS: dict[str, dict[str, str]] = {
    # edge -> aggregator: join (or rejoin)
    "hello": {"device": _INT, "instance": _STR},
    # aggregator -> edge: the run it joins (config, and the secret masks derive from)
    "welcome": {
        "device": _INT,
        "run_id": _STR,
        "config_yaml": _STR,
        "mask_secret": _STR,  # sparsification masks derive from it; only sent here
        "next_round": _INT,
    },
    # edge -> aggregator: set up; its shard size and the nonces its ledger holds
    "ready": {"device": _INT, "instance": _STR, "dataset_size": _INT, "nonces": _LIST},
    # aggregator -> edge: every upload the aggregator recorded for it (ledger reconciliation)
    "sync": {"device": _INT, "events": _LIST},
    # aggregator -> edge: train from this model (payload) and upload in this slot
    "round": {
        "device": _INT,
        "round": _INT,
        "nonce": _STR,
        "d": _INT,
        "channel": _DICT + _OPT,  # channel fields the gated event credits (null: none)
        "slot": _INT,
        "deadline_s": _FLOAT,
        # split usrp link: when the burst is due (start of the device's TDMA slot, s, on the
        # schedule's time base: radio/edge_radio.py); null on simulated links
        "tx_time_s": _FLOAT + _OPT,
        # the privacy event the aggregator gated the upload with (its to_dict(), the
        # mechanism's parameters: e.g. 004's l1 clip, Laplace scale and full batch); the
        # edge records its own and refuses when they differ. Null: the aggregator keeps no
        # ledger (no DP)
        "mechanism": _DICT + _OPT,
    },
    # edge -> aggregator: one upload; payload = symbols (complex128), or empty (0 bytes)
    # when the symbols went over the radio (on_air)
    "upload": {
        "device": _INT,
        "round": _INT,
        "nonce": _STR,
        "header": _DICT,  # UploadHeader.to_dict()
        "n_symbols": _INT,
        "symbol_energy": _FLOAT,
        "train_loss": _FLOAT + _OPT,
        "energy_comp_j": _FLOAT,
        "energy_comp_source": _STR,
        "on_air": _BOOL,  # true: the edge transmitted the symbols itself (split usrp link)
        "tx_report": _DICT + _OPT,  # on_air: TX_REPORT_KEYS of its burst; else null
    },
    # aggregator -> edge: the upload is recorded with these channel fields
    "ack": {"device": _INT, "round": _INT, "nonce": _STR, "channel": _DICT + _OPT},
    # edge -> aggregator: the edge will not upload (never went on air)
    "refuse": {"device": _INT, "round": _INT, "nonce": _STR, "reason": _STR},
    # either way: the run ended (or the edge is going away)
    "leave": {"device": _INT, "reason": _STR},
    # aggregator -> edge, in answer to anything after the run ended: how it ended and every
    # upload recorded for the device (as in ``sync``); the edge adopts them and exits
    "finished": {"device": _INT, "run_id": _STR, "reason": _STR, "events": _LIST},
    # edge -> aggregator: what is your clock? (t_send: the edge's clock when asking, s)
    "clock_req": {"device": _INT, "t_send": _FLOAT},
    # aggregator -> edge: its clock (t_remote, s) when it answered the request t_send
    "clock": {"device": _INT, "t_send": _FLOAT, "t_remote": _FLOAT},
    # --- 002's secure aggregation (zcdp-secagg), after a ``round`` request; every message
    # names the round and the request's nonce. The aggregator only relays; see docs/lab.md.
    # edge -> aggregator, phase 0: its fresh X25519 public keys (hex)
    "sa_keys": {
        "device": _INT, "round": _INT, "nonce": _STR, "mask_public": _STR,
        "channel_public": _STR,
    },
    # aggregator -> edge: U1 with every member's keys ({device, mask_public, channel_public})
    # and the Shamir threshold
    "sa_roster": {"device": _INT, "round": _INT, "nonce": _STR, "threshold": _INT, "keys": _LIST},
    # edge -> aggregator, phase 1: its shares for every other member of U1, encrypted for
    # the recipient ({recipient, nonce, ciphertext}, hex)
    "sa_shares": {"device": _INT, "round": _INT, "nonce": _STR, "shares": _LIST},
    # aggregator -> edge: U2 and the ciphertexts addressed to this device ({sender, nonce,
    # ciphertext})
    "sa_inbox": {
        "device": _INT, "round": _INT, "nonce": _STR, "participants": _LIST, "shares": _LIST,
    },
    # edge -> aggregator, phase 2: the masked update; payload = d uint64 residues
    "sa_masked": {
        "device": _INT, "round": _INT, "nonce": _STR, "d": _INT, "train_loss": _FLOAT + _OPT,
        "energy_comp_j": _FLOAT, "energy_comp_source": _STR,
    },
    # aggregator -> edge: whose masked input arrived (U3) and who dropped (U2 \ U3)
    "sa_unmask_req": {
        "device": _INT, "round": _INT, "nonce": _STR, "received": _LIST, "dropped": _LIST,
    },
    # edge -> aggregator, phase 3: [owner, x, y (hex)] shares of the self-mask seeds of U3
    # and of the mask keys of the dropped
    "sa_unmask": {
        "device": _INT, "round": _INT, "nonce": _STR, "self_mask_shares": _LIST,
        "mask_key_shares": _LIST,
    },
    # aggregator -> edge: this device takes no further part in the round (it was left out,
    # or the round was abandoned)
    "sa_abort": {"device": _INT, "round": _INT, "nonce": _STR, "reason": _STR},
}

#: Payload each type carries: None, "float64" (d values), "complex128" (n_symbols) or
#: "uint64" (d residues).
PAYLOADS: dict[str, str | None] = {
    "hello": None,
    "welcome": None,
    "ready": None,
    "sync": None,
    "round": "float64",
    "upload": "complex128",
    "ack": None,
    "refuse": None,
    "leave": None,
    "finished": None,
    "clock_req": None,
    "clock": None,
    "sa_keys": None,
    "sa_roster": None,
    "sa_shares": None,
    "sa_inbox": None,
    "sa_masked": "uint64",
    "sa_unmask_req": None,
    "sa_unmask": None,
    "sa_abort": None,
}

_MAX_STR = 1_000_000
_MAX_LIST = 10_000_000


@dataclass(frozen=True)
class Message:
    """A validated control-plane message.

    Attributes
    ----------
    type
        One of :data:`SCHEMAS`.
    fields
        Its header fields (exactly those of the schema).
    payload
        Raw payload bytes (float64 weights for ``round``, complex128 symbols for
        ``upload``), else ``None``.
    """

    type: str
    fields: dict[str, Any]
    payload: bytes | None = None

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def _kind_ok(value: Any, kind: str) -> bool:
    if kind.endswith(_OPT):
        if value is None:
            return True
        kind = kind[:-1]
    if kind == _INT:
        return type(value) is int
    if kind == _FLOAT:
        return type(value) in (int, float) and value == value and abs(value) != float("inf")
    if kind == _STR:
        return isinstance(value, str) and len(value) <= _MAX_STR
    if kind == _BOOL:
        return type(value) is bool
    if kind == _DICT:
        return isinstance(value, dict)
    if kind == _LIST:
        return isinstance(value, list) and len(value) <= _MAX_LIST
    raise AssertionError(kind)


def _payload_bytes(msg_type: str, fields: dict[str, Any]) -> int | None:
    kind = PAYLOADS[msg_type]
    if kind in ("float64", "uint64"):
        return 8 * int(fields["d"])
    if kind == "complex128":
        return 0 if fields.get("on_air") else 16 * int(fields["n_symbols"])
    return None


def _check_ranges(msg_type: str, fields: dict[str, Any]) -> None:
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
        if len(members) < SECAGG_MIN_DEVICES or me not in members:
            raise ProtocolError(f"sa_roster: must list at least {SECAGG_MIN_DEVICES} devices, "
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
        if not _kind_ok(report[key], _FLOAT):
            raise ProtocolError(f"upload: tx_report.{key} is not a valid {_FLOAT}")
    bounds = {
        "airtime_s": (0.0, MAX_AIRTIME_S),
        "tx_power_w": (0.0, MAX_TX_POWER_W),
        "timing_uncertainty_s": (0.0, MAX_TIMING_UNCERTAINTY_S),
    }
    for key, (low, high) in bounds.items():
        if not low <= report[key] <= high:
            raise ProtocolError(
                f"upload: tx_report.{key} {report[key]} outside [{low:g}, {high:g}]"
            )
    if report["airtime_s"] == 0:
        raise ProtocolError("upload: tx_report.airtime_s must be > 0")


def encode(msg_type: str, fields: dict[str, Any], payload: bytes | None = None) -> list[bytes]:
    """Frames of a message; validated as the receiver will (a bad message is never sent).

    Raises
    ------
    ProtocolError
        When the fields or payload do not follow :data:`SCHEMAS` / :data:`PAYLOADS`.
    """
    import json

    header = {"v": PROTOCOL_VERSION, "type": msg_type, **fields}
    frames = [json.dumps(header, allow_nan=False, separators=(",", ":")).encode()]
    if payload is not None:
        frames.append(bytes(payload))
    decode(frames)  # the same checks as on receipt
    return frames


def decode(frames: list[bytes]) -> Message:
    """Validate and parse a received multipart message.

    Raises
    ------
    ProtocolError
        On anything that is not a well-formed message of the current version: the reason
        names the field and what was wrong.
    """
    import json

    if not isinstance(frames, list) or not 1 <= len(frames) <= 2:
        got: object = len(frames) if isinstance(frames, list) else type(frames).__name__
        raise ProtocolError(f"expected 1 or 2 frames, got {got}")
    head = bytes(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        data = json.loads(head.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ProtocolError("header is not a JSON object")
    if data.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"version {data.get('v')!r}; this side speaks {PROTOCOL_VERSION}")
    msg_type = data.get("type")
    if not isinstance(msg_type, str) or msg_type not in SCHEMAS:
        raise ProtocolError(f"unknown message type {msg_type!r}; known: {sorted(SCHEMAS)}")
    schema = SCHEMAS[msg_type]
    fields = {k: v for k, v in data.items() if k not in ("v", "type")}
    if set(fields) != set(schema):
        missing, extra = sorted(set(schema) - set(fields)), sorted(set(fields) - set(schema))
        raise ProtocolError(f"{msg_type}: missing fields {missing}, unknown fields {extra}")
    for key, kind in schema.items():
        if not _kind_ok(fields[key], kind):
            raise ProtocolError(f"{msg_type}: field {key!r} is not a valid {kind}")
    _check_ranges(msg_type, fields)
    expected = _payload_bytes(msg_type, fields)
    payload = bytes(frames[1]) if len(frames) == 2 else None
    if expected is None and payload is not None:
        raise ProtocolError(f"{msg_type}: carries no payload, got {len(payload)} bytes")
    if expected is not None and (payload is None or len(payload) != expected):
        got = "none" if payload is None else f"{len(payload)} bytes"
        raise ProtocolError(f"{msg_type}: payload must be {expected} bytes, got {got}")
    return Message(msg_type, fields, payload)


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite constant {name}")
