"""One round of secure aggregation (:mod:`testbed.core.secagg`) with the server and every
device in this process: :func:`run_round`, with chosen dropouts, and its outcome."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from testbed.core.secagg.codec import FixedPointCodec
from testbed.core.secagg.crypto import RandomBytes
from testbed.core.secagg.device import SecAggDevice
from testbed.core.secagg.messages import ServerView
from testbed.core.secagg.server import SecAggServer


@dataclass(frozen=True, eq=False)
class RoundResult:
    """Outcome of :func:`run_round`.

    Attributes
    ----------
    total
        ``(d,)`` float64: the decoded sum of the included updates.
    integer_total
        ``(d,)`` int64: the signed fixed-point sum (``total * scale``).
    included
        ``U3``, the devices in the sum.
    dropped
        Devices of ``U2`` whose input never arrived (their masks were removed).
    view
        Every message the server received.
    """

    total: npt.NDArray[np.float64]
    integer_total: npt.NDArray[np.int64]
    included: frozenset[int]
    dropped: frozenset[int]
    view: ServerView


def run_round(updates: Mapping[int, npt.ArrayLike], dropped_after_masking: Collection[int] = (),
              *, codec: FixedPointCodec, dropped_before_keys: Collection[int] = (),
              dropped_before_upload: Collection[int] = (), threshold: int | None = None,
              self_masks: bool = True, round_index: int = 0,
              random_bytes: RandomBytes = secrets.token_bytes) -> RoundResult:
    """Run one round among the devices of ``updates`` (id -> ``(d,)`` update) in memory.

    Parameters
    ----------
    dropped_after_masking
        Send their masked input, then never answer the unmasking request: included.
    dropped_before_keys
        Never advertise keys (not ready when ``Omega_t`` is formed): excluded, no trace.
    dropped_before_upload
        Take part in key sharing, then their masked input never arrives: excluded, and the
        survivors' masks with them are removed through Shamir recovery of their mask keys.
    codec, threshold, self_masks, round_index, random_bytes
        As for :class:`SecAggServer` / :class:`SecAggDevice`.
    """
    sets = [frozenset(s) for s in (dropped_after_masking, dropped_before_keys,
                                   dropped_before_upload)]
    if any(not s <= set(updates) for s in sets) or sum(map(len, sets)) != len(frozenset().union(
            *sets)):
        raise ValueError("run_round: the dropped sets must be disjoint subsets of the devices")
    after, before_keys, before_upload = sets
    shapes = {np.shape(u) for u in updates.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"run_round: updates must share one 1-D shape, got {shapes}")
    d = next(iter(shapes))[0]
    server = SecAggServer(round_index=round_index, dimension=d, codec=codec,
                          threshold=threshold, self_masks=self_masks)
    devices = {i: SecAggDevice(i, round_index=round_index, dimension=d, codec=codec,
                               self_masks=self_masks, random_bytes=random_bytes)
               for i in sorted(updates) if i not in before_keys}
    for dev in devices.values():
        server.receive_keys(dev.advertise_keys())
    roster = server.roster()
    for dev in devices.values():
        server.receive_share_keys(dev.share_keys(roster))
    u2, inbox = server.forward_shares()
    for j in sorted(u2):
        devices[j].receive_shares(inbox[j], u2)
    for j in sorted(u2 - before_upload):
        server.receive_masked(devices[j].masked_update(updates[j]))
    request = server.unmasking_request()
    for j in sorted(request.received - after):
        server.receive_unmasking(devices[j].reveal_shares(request))
    total = server.aggregate()
    return RoundResult(total, server.integer_sum(), server.included, request.dropped,
                       server.view)
