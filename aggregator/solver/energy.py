"""Energy and power model of 003 Section V-A in the testbed's units.

One upload sends the ``l = theta_s d`` values of ``x = alpha C(g + eta)`` as uncoded analog
symbols, two real values per complex symbol, so it lasts ``n_sym t_cm`` with
``n_sym = l / 2`` symbols of ``t_cm`` seconds. From Lemma 3 and clipping,

    E||x||^2 <= alpha^2 theta_qs (Z^2 + d sigma^2) = theta_qs (Z^2 b + d a),
    (b = alpha^2, a = alpha^2 sigma^2, sums of squares of the l real values),

the mean power per complex symbol is ``p = E||x||^2 / n_sym`` in symbol-power units, or
``p_w = tx_power_ref_w p`` watts, and the upload's radio energy is

    E_comm = p_w * n_sym * t_cm = tx_power_ref_w * t_cm * E||x||^2     (joules).

This is 003 (23), ``E_comm = p_i d theta_s t_cm``, with ``p_i`` the *per-symbol* power and
``d theta_s / 2`` symbols; 003 (28a)/(28d) instead put the vector energy ``E||x||^2`` where a
per-symbol power belongs (see docs/solver.md). The total of (24a) is
``K sum_i (E_comm_i + E_comp_i)`` with ``K = T / H`` uploads.
"""

from __future__ import annotations

import numpy as np


def expected_sq_norm(
    a: np.ndarray, b: np.ndarray, *, theta_qs: float, d: int, z: float
) -> np.ndarray:
    """Upper bound of ``E||x||^2`` per upload, shape like ``a`` (symbol-power units x symbols)."""
    return theta_qs * (z * z * np.asarray(b) + d * np.asarray(a))


def symbols_per_upload(l_value: float) -> float:
    """Complex symbols per upload, ``l / 2`` (two reals per symbol)."""
    return l_value / 2.0


def power_symbol(
    a: np.ndarray, b: np.ndarray, *, theta_qs: float, theta_s: float, d: int, z: float
) -> np.ndarray:
    """Mean transmit power per complex symbol (symbol-power units), shape ``(N,)``."""
    n_sym = symbols_per_upload(theta_s * d)
    return expected_sq_norm(a, b, theta_qs=theta_qs, d=d, z=z) / n_sym


def power_cap_c3(
    p_max_symbol: np.ndarray, *, theta_qs: float, theta_s: float, d: int
) -> np.ndarray:
    """``c3_i`` of (32c) in these units: power <= P_max  <=>  ``Z^2 b + d a <= c3_i``."""
    return np.asarray(p_max_symbol) * symbols_per_upload(theta_s * d) / theta_qs


def comm_energy_per_upload(
    a: np.ndarray, b: np.ndarray, *, theta_qs: float, d: int, z: float,
    t_cm_s: float, tx_power_ref_w: float,
) -> np.ndarray:
    """Radio energy of one upload per device (J), shape ``(N,)``."""
    return tx_power_ref_w * t_cm_s * expected_sq_norm(a, b, theta_qs=theta_qs, d=d, z=z)


def total_energy(
    k_uploads: float, e_comm_per_upload: np.ndarray, e_comp_per_round: np.ndarray
) -> float:
    """(24a): ``K sum_i (E_comm_i + E_comp_i)`` in joules."""
    return float(k_uploads * (np.sum(e_comm_per_upload) + np.sum(e_comp_per_round)))
