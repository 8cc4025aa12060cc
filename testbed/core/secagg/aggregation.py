"""One round of 002's secure aggregation over the participants' updates
(:mod:`testbed.core.secagg`): the aggregator learns only their sum."""

from __future__ import annotations

import numpy as np

from testbed.core.secagg.codec import FixedPointCodec

#: Fixed-point range of an update coordinate (|x| beyond it is clipped before masking: a
#: post-processing of the already private update). Updates here are noisy averaged
#: gradients, orders of magnitude below it; the 64-bit modulus leaves ~2^-33 resolution.
COORDINATE_RANGE = 1.0e3
#: The carrier of a secure-aggregation upload in the metrics (masked integers cannot cross
#: an analog channel).
CARRIER = "control plane (secure aggregation: masked integers, not the radio)"


def round_codec(summands: int) -> FixedPointCodec:
    """The fixed-point codec of a round of at most ``summands`` updates (the server and every
    device of a lab round derive the same one from the run's ``clients_per_round``)."""
    return FixedPointCodec.fit(clip=COORDINATE_RANGE, summands=summands)


def secure_sum(updates: dict[int, np.ndarray], round_index: int) -> np.ndarray:
    """The sum of ``updates`` (device -> ``(d,)`` float64) through pairwise-mask secure
    aggregation with fresh X25519 keys (OS CSPRNG); returns the ``(d,)`` float64 sum."""
    # on use: the key agreement's imports (cryptography) cost every run 15 ms otherwise
    from testbed.core.secagg.local_round import run_round

    codec = round_codec(len(updates))
    clipped = {i: np.clip(np.asarray(u, dtype=np.float64), -COORDINATE_RANGE, COORDINATE_RANGE)
               for i, u in updates.items()}
    return np.asarray(run_round(clipped, codec=codec, round_index=round_index).total,
                      dtype=np.float64)
