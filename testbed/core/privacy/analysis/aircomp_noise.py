"""How much noise each AirComp device adds, and the round's events from what was measured.

The target is an aggregate noise multiplier ``z`` (calibrated with dp-accounting for the
target epsilon over the planned rounds, as for every record-level scheme). With ``N``
participating devices, equal shares ``sigma`` and ``t`` colluders, device ``i`` is protected
by its own share, the ``N - 1 - t`` honest others' and the receiver's credited noise
(docs/privacy.md section 12, perfect alignment):

    z^2 (C / B)^2 = (N - t) sigma^2 + r,        sigma = sqrt(max(0, z^2 (C/B)^2 - r) / (N - t)),

``r`` the receiver noise credited per real coordinate of ``y / c``. With ``t = 0`` each device
adds ``1 / sqrt(N)`` of the noise a device alone would need (``1/N`` of the variance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from testbed.core.privacy.aircomp_events import AirCompEvent


def share_sigma(z: float, *, devices: int, colluding: int, example_clip: float,
                expected_batch: float, receiver_noise_var: float = 0.0,
                others_margin: float = 1.0) -> float:
    """Each device's noise std (value units) so that the aggregate meets multiplier ``z``.

    ``colluding = devices - 1`` gives every device the whole noise itself (local DP).
    ``others_margin`` (in ``(0, 1]``) is the expected ``(rho_lo / rho_hi)^2`` of the
    others' credited noise against a device's own gain bound (1 with known channels): the
    shares solve ``sigma^2 (1 + (devices - 1 - colluding) margin) = (z C / B)^2 - n``.

    Raises
    ------
    ValueError
        ``colluding`` outside ``[0, devices - 1]``, or non-positive arguments.
    """
    if devices < 1 or not 0 <= colluding <= devices - 1:
        raise ValueError(f"need devices >= 1 and 0 <= colluding <= devices - 1, got "
                         f"devices={devices}, colluding={colluding}")
    if not (z > 0 and example_clip > 0 and expected_batch > 0 and receiver_noise_var >= 0):
        raise ValueError("z, example_clip and expected_batch must be > 0, the receiver "
                         "noise >= 0")
    if not 0 < others_margin <= 1:
        raise ValueError(f"others_margin must lie in (0, 1], got {others_margin}")
    target = (z * example_clip / expected_batch) ** 2
    shares = 1.0 + (devices - 1 - colluding) * others_margin
    return math.sqrt(max(0.0, target - receiver_noise_var) / shares)


def round_events(
    *,
    round_index: int,
    devices: Sequence[int],
    sigma: Sequence[float],
    rho_lower: Sequence[float],
    rho_upper: Sequence[float],
    sampling_rate: Sequence[float],
    expected_batch: Sequence[float],
    dataset_size: Sequence[int],
    example_clip: float,
    receiver_noise_var: float,
    colluding: int,
    amplified: bool = True,
    relation: str = "add-remove",
    bound_failure_prob: float = 0.0,
) -> list[AirCompEvent]:
    """One :class:`AirCompEvent` per participating device of a round.

    Parameters
    ----------
    devices
        The devices that transmitted in the slot (device ids), ``K`` of them.
    sigma, rho_lower, rho_upper, sampling_rate, expected_batch, dataset_size
        Per participating device, each of length ``K``: its own noise std, the bounds on its
        misalignment ``|h alpha| / c`` and its record-level sampling.
    receiver_noise_var
        ``tau n0_lo / |c|^2`` (value units per real coordinate of ``y / c``).
    colluding
        ``t`` (``privacy.colluding_devices``).
    bound_failure_prob
        Probability that any credited bound of the round is wrong (every device's event
        carries it: each device's guarantee rests on all of them).
    """
    k = len(devices)
    columns = (sigma, rho_lower, rho_upper, sampling_rate, expected_batch, dataset_size)
    if any(len(c) != k for c in columns):
        raise ValueError(f"every per-device sequence needs {k} entries (one per device sent)")
    if any(lo > hi for lo, hi in zip(rho_lower, rho_upper, strict=True)):
        raise ValueError("need rho_lower <= rho_upper for every device")
    shares = [lo * s for lo, s in zip(rho_lower, sigma, strict=True)]
    return [
        AirCompEvent(
            round=round_index, device=int(dev), sampling_rate=float(sampling_rate[a]),
            amplified=amplified, example_clip=example_clip,
            expected_batch=float(expected_batch[a]), dataset_size=int(dataset_size[a]),
            sigma=float(sigma[a]), gain_ratio_upper=float(rho_upper[a]),
            others_noise_std=tuple(shares[b] for b in range(k) if b != a),
            receiver_noise_var=float(receiver_noise_var), colluding=colluding,
            relation=relation, bound_failure_prob=bound_failure_prob,
        )
        for a, dev in enumerate(devices)
    ]
