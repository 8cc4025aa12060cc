"""The round a run resumes in: its uploads that the ledger holds but ``inflight/`` does not.

The rule (docs/privacy.md section 5.2), the same for every kind of device (in this process,
edges over the control plane, edges on radios): **a (device, round) is released at most
once and charged at most once.** A process that stopped mid-round (a kill, a power cut) can
leave an upload of the round in the ledger without its kept copy in ``inflight/``:

* the kill came between the ledger record and the keep (fault point ``after_commit``);
* an intent was journalled, so the next :class:`~testbed.core.privacy.book.PrivacyBook`
  recorded it with its gated values: the upload may have gone on air (``after_intent``,
  ``after_transmit``, the lab's ``lab_after_request``);
* a torn, not yet fsynced kept record was dropped (:mod:`testbed.core.runs.inflight`).

Such an upload is **lost for the round**: charged once (its record stays), its update not
aggregated, the metrics entry says why, and its device is **not asked again** in that round,
under a new nonce or the recorded one. Asking again would be a second release (a second
burst or reception of the same values: fresh channel noise averages the credited noise
down) or, under a new nonce, a second charge. A journalled intent is never withdrawn on
resume, in process either: once the process is gone nothing proves that the upload did not
leave it (the ``gnuradio`` link hands samples to another process; a lab edge or a USRP may
have sent them), so it is recorded once and its upload never produced a second time.

Only the first round a process runs can hold such uploads: in a round that runs through,
a device is recorded after it was asked.
"""

from __future__ import annotations

from typing import Any

from testbed.core.upload_events import PrivacyEvent

#: Why such an upload is lost (its metrics entry's ``error``).
RECORDED_NOT_KEPT = (
    "recorded before the run stopped, its update not kept: lost for the round and not "
    "asked again (a second request would release or charge the upload twice)")


def recorded_in_round(book: Any, t: int, skip: set[int]
                      ) -> dict[int, tuple[str | None, PrivacyEvent]]:
    """Devices (not in ``skip``) whose upload of round ``t`` the ledger holds, each with the
    nonce and event recorded (the first, if several).

    Parameters
    ----------
    book
        The run's :class:`~testbed.core.privacy.book.PrivacyBook` (``None``: no ledger, so
        nothing is recorded).
    t
        The round.
    skip
        Devices whose upload of round ``t`` is kept (``inflight/``): not lost.
    """
    if book is None:
        return {}
    out: dict[int, tuple[str | None, PrivacyEvent]] = {}
    for entry in book.ledger.entries():
        event = entry.event
        i = int(event.device)
        if event.round == t and i not in skip and i not in out:
            out[i] = (entry.nonce, event)
    return out


def lost_entry(i: int, why: str = RECORDED_NOT_KEPT) -> dict[str, Any]:
    """Metrics entry of device ``i``, charged for the round already, whose update the round
    does not have (``why``: the entry's ``error``)."""
    return {"device": i, "transmitted": None, "charged": True, "resumed": True, "lost": True,
            "error": why}
