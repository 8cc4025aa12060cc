"""A record-level round's per-step Gaussian noise, each step's drawn while the step before
it (or the round's first step) computes.

Every draw is :func:`testbed.core.noise.gaussian` (``os.urandom`` + Box-Muller in float64,
rounded once to float32), as when drawn in the step itself; only *when* it is drawn
changes. A draw runs in the process's side thread (:func:`radio.side_thread.side_thread`):
``os.urandom`` and numpy's ufuncs release the GIL, so on a host with a free core the draw
(about 1 ms for d = 21,840) no longer adds to the step's wall time; its CPU time is the
same. Two buffers alternate: step ``t`` reads one while step ``t + 1``'s draw fills the
other, which step ``t - 1`` finished with (its :meth:`NoiseAhead.take` came before step
``t``'s). No value is used twice: a buffer is handed out once per draw into it, and a draw
completes before its buffer is handed out.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import TracebackType

import numpy as np
import torch

from radio.side_thread import side_thread
from testbed.core.noise import gaussian


class NoiseAhead:
    """The noise of ``steps`` steps, ``N(0, sigma^2 I)`` each, ``float32 (d,)``.

    Parameters
    ----------
    d
        Coordinates per draw.
    sigma
        Standard deviation per coordinate (``> 0``).
    steps
        Draws in the round (``>= 1``).

    Use as a context manager; :meth:`take` once per step, in order. Leaving the block waits
    for a draw still running (a round that stopped early), so no thread writes into a
    buffer afterwards.
    """

    def __init__(self, d: int, sigma: float, steps: int) -> None:
        if steps < 1 or d < 1 or not sigma > 0:
            raise ValueError(f"NoiseAhead: need d >= 1, sigma > 0, steps >= 1; got {d}, "
                             f"{sigma}, {steps}")
        self.d, self.sigma, self.steps = d, float(sigma), steps
        self._buffers = [torch.empty(d, dtype=torch.float32) for _ in range(min(steps, 2))]
        self._taken = 0
        self._pending: Future[np.ndarray] | None = None

    def __enter__(self) -> NoiseAhead:
        self._start(0)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - a draw no step will use; the block's error wins
                if kind is None:
                    raise

    def _start(self, t: int) -> None:
        buffer = self._buffers[t % len(self._buffers)].numpy()
        self._pending = side_thread().submit(gaussian, self.d, self.sigma, out=buffer)

    def take(self) -> torch.Tensor:
        """This step's noise (waits for its draw), and the next step's draw started. The
        tensor is valid until the next :meth:`take`, which starts refilling it."""
        t = self._taken
        if t >= self.steps or self._pending is None:
            raise RuntimeError(f"NoiseAhead: step {t} of {self.steps}, or used outside "
                               "its with block")
        self._pending.result()  # raises the draw's error (no noise: no step)
        self._pending = None
        self._taken = t + 1
        if t + 1 < self.steps:
            self._start(t + 1)
        return self._buffers[t % len(self._buffers)]
