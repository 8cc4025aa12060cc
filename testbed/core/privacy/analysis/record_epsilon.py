"""The record-level epsilon of one device (:class:`RecordEpsilon`), the accountants that
compute it (``"rdp"``, ``"pld"``: :mod:`testbed.core.privacy.analysis.record_compose`'s engines,
chosen and checked by name) and the step from an engine's composed state to the figure, shared by
the accountant (:mod:`testbed.core.privacy.accountants.record_accountant`), the planning functions
(:mod:`testbed.core.privacy.accountants.record_planning`) and the device-level figure
(:mod:`testbed.core.privacy.analysis.record_device_level`)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

from testbed.core.privacy.analysis.rdp import OrderAtEdgeWarning
from testbed.core.privacy.analysis.record_compose import PldEngine, RdpEngine
from testbed.core.privacy.record_events import RELATIONS

RECORD_ACCOUNTANTS = ("rdp", "pld")
#: PLD value discretization (nats): 1e-3 is within ~1e-4 relative of 1e-4 at 10x the speed.
DEFAULT_PLD_DISCRETIZATION = 1e-3
#: Relative log-grid step z is rounded down to, per accountant (RDP curves are cheap).
DEFAULT_Z_RESOLUTION = {"rdp": 0.0, "pld": 1e-3}


@dataclass(frozen=True)
class RecordEpsilon:
    """``(epsilon, delta)`` of one device at the record level.

    Attributes
    ----------
    epsilon
        ``0.0`` with nothing released, ``inf`` when unbounded.
    delta
        The delta it holds for.
    accountant
        ``"rdp"`` or ``"pld"``.
    relation
        ``"add-remove"`` or ``"replace-one"``.
    order
        The Renyi order attaining it (``"rdp"``; ``inf`` at epsilon 0), ``nan`` for ``"pld"``.
    events
        Events composed.
    steps
        Subsampled-Gaussian steps composed (sum of the events' ``steps``).
    order_at_edge
        ``True`` when the optimal order is at the edge of the grid (a valid bound, maybe not
        the smallest).
    """

    epsilon: float
    delta: float
    accountant: str
    relation: str
    order: float = math.nan
    events: int = 0
    steps: int = 0
    order_at_edge: bool = False


def make_engine(accountant: str, relation: str, z_resolution: float | None,
                pld_discretization: float) -> RdpEngine | PldEngine:
    """The composition engine of ``accountant`` (``rdp`` or ``pld``) for ``relation``.

    ``z_resolution``: grid on which noise multipliers are rounded down (``None``: the
    accountant's default); ``pld_discretization``: the PLD's loss grid. Raises ``ValueError``
    on a value out of range."""
    if accountant not in RECORD_ACCOUNTANTS:
        raise ValueError(f"accountant={accountant!r} not in {RECORD_ACCOUNTANTS}")
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r} not in {RELATIONS}")
    res = DEFAULT_Z_RESOLUTION[accountant] if z_resolution is None else z_resolution
    if isinstance(res, bool) or not (isinstance(res, int | float) and 0 <= res < 1):
        raise ValueError(f"z_resolution={z_resolution!r} must lie in [0, 1)")
    if not (isinstance(pld_discretization, int | float) and 0 < pld_discretization <= 0.1):
        raise ValueError(f"pld_discretization={pld_discretization!r} must lie in (0, 0.1]")
    if accountant == "rdp":
        return RdpEngine(relation, float(res))
    return PldEngine(relation, float(res), float(pld_discretization))


def check_delta(where: str, delta: Any) -> float:
    """``delta`` as a float if it lies in ``(0, 1)``, else ``ValueError`` naming ``where``."""
    if isinstance(delta, bool) or not (isinstance(delta, int | float) and 0 < delta < 1):
        raise ValueError(f"{where}: delta={delta!r} must lie in (0, 1)")
    return float(delta)


def epsilon_result(engine: RdpEngine | PldEngine, state: Any, delta: float, events: int,
                   steps: int) -> RecordEpsilon:
    """The :class:`RecordEpsilon` of ``state`` (composed by ``engine``) at ``delta``; warns
    (:class:`OrderAtEdgeWarning`) when the best Renyi order lies at the edge of the grid."""
    if events == 0:
        eps, order, edge = 0.0, (math.inf if engine.name == "rdp" else math.nan), False
    else:
        eps, order, edge = engine.epsilon(state, delta)
    if edge:
        warnings.warn(
            f"optimal Renyi order {order:g} is at the edge of the order grid; epsilon "
            f"{eps:.6g} is a valid upper bound but may not be the smallest",
            OrderAtEdgeWarning,
            stacklevel=3,
        )
    return RecordEpsilon(epsilon=eps, delta=delta, accountant=engine.name,
                         relation=engine.relation, order=order, events=events, steps=steps,
                         order_at_edge=edge)
