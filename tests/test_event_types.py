"""The privacy event types have one home (``testbed/core/privacy/event_types.py``): the
union, the class lists and every tag table derived from them agree, and the tags a ledger
holds are the ones it always held."""

from __future__ import annotations

from typing import get_args

from testbed.core import upload_events
from testbed.core.privacy.accountants.record_accountant import RECORD_EVENT_TYPES
from testbed.core.privacy.aircomp_events import AirCompEvent
from testbed.core.privacy.event_types import (
    DEVICE_CLASSES,
    EVENT_CLASSES,
    RECORD_CLASSES,
    UNIT_CLASSES,
    AnyRecordEvent,
    PrivacyEvent,
)
from testbed.core.privacy.ledger import EVENT_TYPES


def test_the_union_is_the_class_list() -> None:
    assert set(get_args(PrivacyEvent)) == set(EVENT_CLASSES)
    assert set(get_args(AnyRecordEvent)) == set(RECORD_CLASSES)
    assert EVENT_CLASSES == DEVICE_CLASSES + RECORD_CLASSES
    assert UNIT_CLASSES == {"device": DEVICE_CLASSES, "record": RECORD_CLASSES}


def test_tag_tables_derive_from_it_with_the_same_tags() -> None:
    assert list(EVENT_TYPES) == ["upload/v1", "record-sgm/v1", "record-laplace/v1",
                                 "record-aircomp/v1"]
    assert list(EVENT_TYPES.values()) == list(EVENT_CLASSES)
    assert RECORD_EVENT_TYPES == {c.TYPE: c for c in RECORD_CLASSES}


def test_an_upload_event_may_be_an_aircomp_event() -> None:
    assert upload_events.PrivacyEvent is PrivacyEvent
    assert AirCompEvent in get_args(upload_events.PrivacyEvent)
