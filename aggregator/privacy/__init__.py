"""Privacy accounting for the aggregator (no torch): events, RDP math, two accountings,
a per-device accountant, a durable ledger and a budget guard. See ``docs/privacy.md``."""

from aggregator.privacy.accountant import (
    MODES,
    NOISE_POSITIONS,
    EpsilonResult,
    PrivacyAccountant,
    epsilon_for,
    upload_coefficient,
)
from aggregator.privacy.budget import BudgetGuard
from aggregator.privacy.events import (
    CLIP_MODES,
    MECHANISMS,
    QUANTIZER_SCALES,
    EventError,
    UploadEvent,
)
from aggregator.privacy.ledger import Ledger, LedgerError, TornLineWarning, rebuild_accountant
from aggregator.privacy.paper import kappa, paper_coefficient
from aggregator.privacy.rdp import (
    CONVERSIONS,
    OrderAtEdgeWarning,
    compose,
    convert,
    epsilon_from_rdp,
    gaussian_epsilon,
    gaussian_epsilon_closed_form,
    gaussian_rdp,
    gaussian_rdp_coefficient,
)
from aggregator.privacy.strict import masked_sensitivity, sparse_norm_bound, strict_coefficient

__all__ = [
    "CLIP_MODES",
    "CONVERSIONS",
    "MECHANISMS",
    "MODES",
    "NOISE_POSITIONS",
    "QUANTIZER_SCALES",
    "BudgetGuard",
    "EpsilonResult",
    "EventError",
    "Ledger",
    "LedgerError",
    "OrderAtEdgeWarning",
    "PrivacyAccountant",
    "TornLineWarning",
    "UploadEvent",
    "compose",
    "convert",
    "epsilon_for",
    "epsilon_from_rdp",
    "gaussian_epsilon",
    "gaussian_epsilon_closed_form",
    "gaussian_rdp",
    "gaussian_rdp_coefficient",
    "kappa",
    "masked_sensitivity",
    "paper_coefficient",
    "rebuild_accountant",
    "sparse_norm_bound",
    "strict_coefficient",
    "upload_coefficient",
]
