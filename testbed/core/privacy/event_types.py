"""The privacy event types, in one place: the classes a ledger holds, their union for
annotations, and the table that reads an event's JSON ``type`` tag.

A new event type is listed here, once (its accountant must compose it too): the ledger's
:data:`~testbed.core.privacy.ledger.EVENT_TYPES`, the record accountant's table, the privacy
book's classes per unit (:data:`UNIT_CLASSES`) and the upload's event
(:mod:`testbed.core.upload_events`) all derive from these names. This module depends only
on the event modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias, TypeVar

from testbed.core.privacy.aircomp_events import AirCompEvent
from testbed.core.privacy.events import UploadEvent
from testbed.core.privacy.record_events import LaplaceRecordEvent, RecordEvent

__all__ = [
    "DEVICE_CLASSES",
    "EVENT_CLASSES",
    "RECORD_CLASSES",
    "UNIT_CLASSES",
    "AnyRecordEvent",
    "PrivacyEvent",
    "by_type_tag",
]

#: Any record-level event.
AnyRecordEvent: TypeAlias = RecordEvent | LaplaceRecordEvent | AirCompEvent
#: Any event the ledger holds (one upload's privacy event, at either unit).
PrivacyEvent: TypeAlias = UploadEvent | AnyRecordEvent

#: The classes of the device unit (one device's whole clipped update).
DEVICE_CLASSES: tuple[type[UploadEvent], ...] = (UploadEvent,)
#: The classes of :data:`AnyRecordEvent`, for ``isinstance``.
RECORD_CLASSES: tuple[type[AnyRecordEvent], ...] = (RecordEvent, LaplaceRecordEvent, AirCompEvent)
#: The classes of :data:`PrivacyEvent`, for ``isinstance``.
EVENT_CLASSES: tuple[type[PrivacyEvent], ...] = DEVICE_CLASSES + RECORD_CLASSES
#: The classes each privacy unit records.
UNIT_CLASSES: Mapping[str, tuple[type[PrivacyEvent], ...]] = {
    "device": DEVICE_CLASSES,
    "record": RECORD_CLASSES,
}


_E = TypeVar("_E", bound=PrivacyEvent)


def by_type_tag(classes: tuple[type[_E], ...]) -> dict[str, type[_E]]:
    """``classes`` by their JSON ``type`` tag (a fresh dict); refuses a tag taken twice."""
    out: dict[str, type[_E]] = {}
    for cls in classes:
        if cls.TYPE in out:
            raise ValueError(f"event type {cls.TYPE!r} is taken by {out[cls.TYPE].__name__} "
                             f"and {cls.__name__}")
        out[cls.TYPE] = cls
    return out
