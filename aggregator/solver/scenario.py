"""The solver's input: one frozen, validated scenario (003 Section V).

Units (see ``docs/solver.md``)
------------------------------
* ``h``: channel amplitude ``|h_i| > 0`` (dimensionless; mean power gain 1 at the configured SNR).
* ``n0``: channel noise variance **per real coordinate**, in symbol-power units. A complex
  baseband symbol with noise ``N0_c = E|n|^2`` carries ``N0_c / 2`` on each of I and Q; the
  testbed packs two real values per complex symbol, so each transmitted real value sees
  ``n0 = N0_c / 2``. (The paper's ``N_0`` is this per-coordinate variance.)
* ``p_max_w``: maximum average transmit power in watts. A symbol stream of unit mean
  ``|x|^2`` radiates ``tx_power_ref_w`` watts, so the limit in symbol-power units is
  ``p_max_w / tx_power_ref_w``.
* ``e_comp_j``: local computing energy per global round (H local steps) in joules.
* ``t_cm_s``: duration of one complex symbol in seconds (``1 / symbol_rate_hz``).
* ``clip_bound``: Z, the l2 bound of the clipped differential (per-coordinate clipping
  ``|g_j| <= Z / sqrt(d)`` implies it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


class ScenarioError(ValueError):
    """A scenario value was refused; the message names the field, the value and the rule."""


def _positive_array(name: str, value: Any, n: int | None) -> tuple[float, ...]:
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if arr.ndim != 1 or arr.size == 0:
        raise ScenarioError(f"{name}: expected a number or a 1-d list, got {value!r}")
    if n is not None and arr.size == 1 and n > 1:
        arr = np.full(n, float(arr[0]))
    if n is not None and arr.size != n:
        raise ScenarioError(f"{name}: expected {n} values (one per device), got {arr.size}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ScenarioError(f"{name}[{i}]: got {arr[i]!r}; allowed: finite and > 0")
    return tuple(float(x) for x in arr)


@dataclass(frozen=True)
class Scenario:
    """Everything the EE-DP-FL solver needs; validated on construction.

    Attributes
    ----------
    h
        ``|h_i|``, shape ``(N,)``, > 0.
    n0
        Channel noise variance per real coordinate, shape ``(N,)`` (a scalar broadcasts).
    p_max_w
        Maximum transmit power per device (W), shape ``(N,)``.
    e_comp_j
        Computing energy per device per round (J), shape ``(N,)``; may be 0.
    d
        Model size (number of parameters).
    local_steps
        H, local SGD steps per round.
    clip_bound
        Z, l2 bound of the clipped differential.
    epsilon, delta
        Per-device privacy target over the whole training.
    beta1, beta2
        Constants of the convergence model (25): ``K >= beta1 theta_qs + beta2 * mean_i
        kappa (theta_qs sigma_i^2 + n0_i / (h_i alpha_i)^2)``.
    t_cm_s
        Complex-symbol duration (s).
    tx_power_ref_w
        Radiated watts of a unit-power symbol stream.
    trusted
        Fraction in [0, 1] of the channel noise credited for privacy (1 = all).
    q_min, q_max
        Allowed quantization levels Q (003: 1 <= Q <= 32).
    l_min
        Smallest sparsity level l.
    k_max
        Largest number of uploads K the solver may plan.
    """

    h: tuple[float, ...]
    n0: tuple[float, ...]
    p_max_w: tuple[float, ...]
    e_comp_j: tuple[float, ...]
    d: int
    local_steps: int = 20
    clip_bound: float = 5.0
    epsilon: float = 5.0
    delta: float = 1e-5
    beta1: float = 1.0
    beta2: float = 1e-3
    t_cm_s: float = 5e-6
    tx_power_ref_w: float = 0.1
    trusted: float = 1.0
    q_min: int = 1
    q_max: int = 32
    l_min: int = 1
    k_max: int = 10_000_000

    def __post_init__(self) -> None:
        h = _positive_array("h", self.h, None)
        n = len(h)
        object.__setattr__(self, "h", h)
        object.__setattr__(self, "n0", _positive_array("n0", self.n0, n))
        object.__setattr__(self, "p_max_w", _positive_array("p_max_w", self.p_max_w, n))
        e = np.atleast_1d(np.asarray(self.e_comp_j, dtype=np.float64))
        if e.size == 1 and n > 1:
            e = np.full(n, float(e[0]))
        if e.ndim != 1 or e.size != n:
            raise ScenarioError(f"e_comp_j: expected {n} values (one per device), got {e.size}")
        if (~np.isfinite(e) | (e < 0)).any():
            raise ScenarioError(f"e_comp_j: got {e.tolist()!r}; allowed: finite and >= 0")
        object.__setattr__(self, "e_comp_j", tuple(float(x) for x in e))
        _int_at_least("d", self.d, 1)
        _int_at_least("local_steps", self.local_steps, 1)
        _int_at_least("q_min", self.q_min, 1)
        _int_at_least("q_max", self.q_max, self.q_min)
        _int_at_least("l_min", self.l_min, 1)
        _int_at_least("k_max", self.k_max, 1)
        if self.l_min > self.d:
            raise ScenarioError(f"l_min: got {self.l_min}; allowed: 1 <= l_min <= d = {self.d}")
        _float_in("clip_bound", self.clip_bound, 0.0, math.inf, lo_open=True)
        _float_in("epsilon", self.epsilon, 0.0, math.inf, lo_open=True)
        _float_in("delta", self.delta, 0.0, 1.0, lo_open=True, hi_open=True)
        _float_in("beta1", self.beta1, 0.0, math.inf)
        _float_in("beta2", self.beta2, 0.0, math.inf, lo_open=True)
        _float_in("t_cm_s", self.t_cm_s, 0.0, math.inf, lo_open=True)
        _float_in("tx_power_ref_w", self.tx_power_ref_w, 0.0, math.inf, lo_open=True)
        _float_in("trusted", self.trusted, 0.0, 1.0)

    # -- derived arrays -------------------------------------------------------------------
    @property
    def n_devices(self) -> int:
        """N, the number of devices."""
        return len(self.h)

    def arrays(self) -> dict[str, np.ndarray]:
        """Per-device values as ``float64`` arrays of shape ``(N,)``."""
        return {
            "h": np.asarray(self.h),
            "n0": np.asarray(self.n0),
            "p_max_w": np.asarray(self.p_max_w),
            "e_comp_j": np.asarray(self.e_comp_j),
        }

    def channel_noise_eff(self) -> np.ndarray:
        """``n_i = n0_i / h_i^2``: channel noise per coordinate after inversion at alpha = 1."""
        return np.asarray(self.n0) / np.asarray(self.h) ** 2

    def p_max_symbol(self) -> np.ndarray:
        """Power limits in symbol-power units, shape ``(N,)``."""
        return np.asarray(self.p_max_w) / self.tx_power_ref_w

    def replace(self, **changes: Any) -> Scenario:
        """A copy with some fields changed (validated again)."""
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values.update(changes)
        return Scenario(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping (lists for per-device values) for YAML/JSON."""
        out: dict[str, Any] = {}
        for f in self.__dataclass_fields__:
            v = getattr(self, f)
            out[f] = list(v) if isinstance(v, tuple) else v
        return out


def _int_at_least(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
        raise ScenarioError(f"{name}: got {value!r}; allowed: an integer >= {lo}")


def _float_in(
    name: str,
    value: Any,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"{name}: got {value!r}; allowed: a number") from None
    ok = math.isfinite(x) and (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
    if not ok:
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ScenarioError(
            f"{name}: got {value!r}; allowed: a finite number in {lb}{lo}, {hi}{rb}"
        )
