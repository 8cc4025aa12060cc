"""Helpers shared by the radio tests (not a test module)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from radio.flowgraph_process import gnuradio_available

_GR: tuple[bool, str] | None = None


def require_gnuradio() -> str:
    """Skip locally, fail in CI (``CI=true``), when /usr/bin/python3 cannot import GNU Radio."""
    global _GR
    if _GR is None:
        _GR = gnuradio_available()
    ok, why = _GR
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"GNU Radio is required in CI: {why}")
        pytest.skip(f"GNU Radio not importable under /usr/bin/python3: {why}")
    return why


def unit_payload(n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-power complex Gaussian symbols, shape ``(n,)``."""
    return (rng.standard_normal(n) + 1j * rng.standard_normal(n)) / np.sqrt(2)


def nmse_db(y: np.ndarray, gain: np.ndarray, x: np.ndarray) -> float:
    """NMSE (dB) of the zero-forcing estimate ``y / gain`` of ``x``."""
    return float(10 * np.log10(np.mean(np.abs(y / gain - x) ** 2) / np.mean(np.abs(x) ** 2)))


def expected_nmse_db(n0: float, gain: np.ndarray) -> float:
    """NMSE (dB) expected after zero forcing: ``mean(N0 / |h|^2)`` for a unit-power payload."""
    return float(10 * np.log10(np.mean(n0 / np.abs(gain) ** 2)))
