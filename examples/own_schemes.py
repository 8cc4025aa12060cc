"""Two of a lab's own schemes by import string (docs/extensions.md "A lab's own scheme").

* :class:`MajorityVote`: signSGD with majority vote (Bernstein et al., ICML 2018), the
  scheme of over-the-air majority-vote testbeds: each device sends the sign of each
  coordinate of its update, scaled by its mean magnitude; the aggregator steps along the
  sign of the sum (the vote), scaled by the mean magnitude received. No privacy (base
  ``fedavg``).
* :class:`TrimmedMean`: the coordinate-wise trimmed mean (Yin et al., ICML 2018) of the
  private uploads of ``ldp-fedavg``: robust to a device whose upload was decoded badly (a
  failed channel estimate) or is malicious. It changes only the aggregator's side, which is
  post-processing of private uploads, so it is allowed under every unit and noise position;
  every upload's privacy event is ldp-fedavg's.

Use: ``scheme: examples.own_schemes:MajorityVote`` (from the repository root, or with the
root in ``extensions_path``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from testbed.core.scheme_api import Scheme


class MajorityVote(Scheme):
    """signSGD with majority vote over the analog uplink (no privacy)."""

    base = "fedavg"

    def prepare(self, differential: np.ndarray, *, device: int, round_index: int) -> np.ndarray:
        """``sign(g) * mean|g|``: one magnitude per device, a sign per coordinate."""
        g = np.asarray(differential, dtype=np.float64)
        return np.sign(g) * float(np.mean(np.abs(g)))

    def combine(
        self, differentials: Sequence[np.ndarray], *, n_devices: int, round_index: int
    ) -> np.ndarray:
        """``sign(sum_i s_i) * mean_i mean|s_i| * (received / n_devices)``: the vote,
        scaled as the mean of the received magnitudes (devices that sat out count zero)."""
        stack = np.stack([np.asarray(s, dtype=np.float64) for s in differentials])
        magnitude = float(np.mean(np.abs(stack)))
        return np.sign(stack.sum(axis=0)) * magnitude * (len(differentials) / n_devices)


class TrimmedMean(Scheme):
    """Coordinate-wise trimmed mean of ldp-fedavg's private uploads.

    Attributes
    ----------
    trim
        Fraction of the received uploads dropped at each end of every coordinate (at least
        one at each end when three or more are received).
    """

    base = "ldp-fedavg"
    trim = 0.1

    def combine(
        self, differentials: Sequence[np.ndarray], *, n_devices: int, round_index: int
    ) -> np.ndarray:
        """The mean of each coordinate's middle values, times ``received / n_devices``."""
        stack = np.sort(np.stack([np.asarray(s, dtype=np.float64) for s in differentials]),
                        axis=0)
        n = len(stack)
        k = max(1, int(self.trim * n)) if n >= 3 else 0
        middle = stack[k:n - k]
        return middle.mean(axis=0) * (n / n_devices)
