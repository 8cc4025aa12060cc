"""Control-plane messages shared by edge devices and the aggregator.

Only side information travels here; model-update values travel over the link as analog
symbols. The exception is 002's secure aggregation (``sa_*``): masked integers cannot cross
an analog channel, so they travel here, masked. This module holds the upload header, the
message format's version and sizes, :class:`Message` and :func:`encode` / :func:`decode`;
what each message type carries is in :mod:`testbed.core.transport.protocol_schema`, the checks of
its
fields in :mod:`testbed.core.transport.protocol_checks`. None of the three imports anything else of
the project.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from testbed.core.transport.protocol_checks import check_ranges, kind_ok, payload_bytes
from testbed.core.transport.protocol_schema import SCHEMAS, ProtocolError


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
#: 002's secure aggregation. 4: rounds paced by the edges on the split ``usrp`` link
#: (``round`` carries ``await_slot``; ``upload_ready`` and ``slot``).
PROTOCOL_VERSION = 4
#: Largest control-plane message either side accepts (bytes); libzmq drops larger ones
#: before they are read. An upload of d parameters is 8 d bytes (d/2 complex symbols), a
#: model 8 d bytes: models up to about 8 million parameters.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Largest JSON header accepted (bytes).
MAX_HEADER_BYTES = 4 * 1024 * 1024


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
        if not kind_ok(fields[key], kind):
            raise ProtocolError(f"{msg_type}: field {key!r} is not a valid {kind}")
    check_ranges(msg_type, fields)
    expected = payload_bytes(msg_type, fields)
    payload = bytes(frames[1]) if len(frames) == 2 else None
    if expected is None and payload is not None:
        raise ProtocolError(f"{msg_type}: carries no payload, got {len(payload)} bytes")
    if expected is not None and (payload is None or len(payload) != expected):
        got = "none" if payload is None else f"{len(payload)} bytes"
        raise ProtocolError(f"{msg_type}: payload must be {expected} bytes, got {got}")
    return Message(msg_type, fields, payload)


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite constant {name}")
