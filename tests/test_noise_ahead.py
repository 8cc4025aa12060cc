"""A record-level round's per-step noise drawn one step ahead, in the side thread: fresh
N(0, sigma^2) draws, one per step, errors raised where the step would have drawn."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import edge_device.noise_ahead as ahead_mod
from edge_device.noise_ahead import NoiseAhead


def test_each_step_gets_its_own_fresh_gaussian_draw() -> None:
    d, sigma, steps = 20_000, 2.5, 5
    seen = []
    with NoiseAhead(d, sigma, steps) as noise:
        for _ in range(steps):
            z = noise.take()
            assert z.shape == (d,) and str(z.dtype) == "torch.float32"
            seen.append(z.numpy().copy())  # copied: the next take refills it
    for a in seen:  # OS-CSPRNG draws, unseeded: a bound with a false failure under 1e-6 a run
        assert stats.kstest(a / sigma, "norm").pvalue > 1e-7
    for i in range(steps):
        for j in range(i):
            assert abs(np.corrcoef(seen[i], seen[j])[0, 1]) < 0.05  # independent draws
            assert not np.array_equal(seen[i], seen[j])


def test_two_buffers_alternate_one_draw_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step t's draw fills buffer t mod 2; the draw into step t's buffer for step t + 2 is
    only started by step t + 1's take, after step t used it."""
    filled: list[int] = []
    real = ahead_mod.gaussian

    def spy(d: int, sigma: float, *, out: np.ndarray) -> np.ndarray:
        filled.append(out.__array_interface__["data"][0])
        return real(d, sigma, out=out)

    monkeypatch.setattr(ahead_mod, "gaussian", spy)
    handed: list[int] = []
    with NoiseAhead(100, 1.0, 5) as noise:
        for _ in range(5):
            handed.append(noise.take().data_ptr())
        with pytest.raises(RuntimeError, match="step 5 of 5"):
            noise.take()
    a, b = handed[0], handed[1]
    assert a != b and handed == [a, b, a, b, a]
    assert filled == handed  # one draw per step, into the buffer that step reads


def test_a_failed_draw_is_raised_at_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(d: int, sigma: float, *, out: np.ndarray) -> np.ndarray:
        raise OSError("getrandom failed")

    monkeypatch.setattr(ahead_mod, "gaussian", broken)
    with pytest.raises(OSError, match="getrandom failed"), NoiseAhead(10, 1.0, 3) as noise:
        noise.take()
    with pytest.raises(ValueError, match="sigma > 0"):
        NoiseAhead(10, 0.0, 3)


def test_leaving_early_waits_for_the_draw_in_flight() -> None:
    with NoiseAhead(50_000, 1.0, 3) as noise:
        noise.take()
        pending = noise._pending
    assert pending is not None and pending.done()
