"""The air's sample timeline: bursts superposed on fresh thermal noise, rendered in order.

Air sample ``k`` is at true time ``t0 + k / fs``. Samples ``0 .. next_index-1`` are rendered
(sent or dropped, never again); a burst is held from its arrival until its last sample is
rendered, then released. Every rendered sample carries fresh circular complex Gaussian noise
of power ``noise_power_w`` (W) from the OS CSPRNG (:func:`testbed.core.noise.gaussian`, the
privacy noise's sampler: no seed, nothing in a run directory regenerates it), plus the sum of
every burst that covers it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.core.noise import gaussian


@dataclass
class HeldBurst:
    """A burst on the timeline, waiting to be rendered.

    Attributes
    ----------
    first
        Air index of ``samples[0]`` (after any late head was cut).
    samples
        ``complex128`` received amplitude, shape ``(m,)``.
    record
        What the air log gets for it once released.
    """

    first: int
    samples: np.ndarray
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        """One past the air index of the last sample."""
        return self.first + int(self.samples.size)


def complex_noise(n: int, power_w: float) -> np.ndarray:
    """``n`` samples of circular complex Gaussian noise, ``E|z|^2 = power_w`` (W), from the OS
    CSPRNG: ``complex128``, shape ``(n,)``."""
    if power_w == 0 or n == 0:
        return np.zeros(n, dtype=np.complex128)
    return gaussian(2 * int(n), math.sqrt(power_w / 2.0)).view(np.complex128)


class Timeline:
    """Bursts waiting on the air's sample grid and the render cursor.

    Parameters
    ----------
    noise_power_w
        Thermal noise power per complex sample, ``N0 fs`` (W), ``>= 0``.
    """

    def __init__(self, noise_power_w: float) -> None:
        if not (math.isfinite(noise_power_w) and noise_power_w >= 0):
            raise ValueError(f"noise_power_w: got {noise_power_w}; allowed: a finite "
                             "number >= 0 (W)")
        self.noise_power_w = float(noise_power_w)
        #: The next air index to render.
        self.next_index = 0
        self.held: list[HeldBurst] = []

    def add(self, first: int, samples: np.ndarray, record: dict[str, Any]) -> int | None:
        """Hold a received burst until it is rendered.

        Returns
        -------
        int or None
            Samples lost because they were already rendered (0: on time); ``None``: the
            burst lies wholly in the rendered past and is not held.
        """
        end = first + int(samples.size)
        if end <= self.next_index and samples.size:
            return None
        lost = max(0, self.next_index - first)
        if lost:
            samples = samples[lost:]
            first += lost
        self.held.append(HeldBurst(first, samples, record))
        return lost

    def render(self, n: int) -> tuple[int, np.ndarray, list[HeldBurst]]:
        """Render the next ``n`` samples.

        Returns
        -------
        index
            Air index of the first rendered sample.
        samples
            ``complex64`` amplitude at the receiver (W), shape ``(n,)``: noise plus bursts.
        released
            Bursts whose last sample is now rendered (no longer held).
        """
        a = self.next_index
        b = a + int(n)
        y = complex_noise(n, self.noise_power_w)
        keep: list[HeldBurst] = []
        released: list[HeldBurst] = []
        for hb in self.held:
            lo, hi = max(a, hb.first), min(b, hb.end)
            if lo < hi:
                y[lo - a : hi - a] += hb.samples[lo - hb.first : hi - hb.first]
            (released if hb.end <= b else keep).append(hb)
        self.held = keep
        self.next_index = b
        return a, y.astype(np.complex64), released
