"""Privacy accounting for the aggregator (no torch): events, RDP math, two accountings,
a per-device accountant, a durable ledger and a budget guard; and the record-level unit
(Poisson-subsampled Gaussians composed with dp-accounting). See ``docs/privacy.md``."""

from aggregator.privacy.accountant import (
    MODES,
    NOISE_POSITIONS,
    EpsilonResult,
    PrivacyAccountant,
    epsilon_for,
    upload_coefficient,
)
from aggregator.privacy.budget import BudgetGuard, SupportsEpsilon
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
from aggregator.privacy.record_accountant import (
    RECORD_ACCOUNTANTS,
    RecordAccountant,
    RecordEpsilon,
    calibrate_noise_multiplier,
    device_level_epsilon,
    record_epsilon_for,
)
from aggregator.privacy.record_events import RELATIONS, LaplaceRecordEvent, RecordEvent
from aggregator.privacy.record_rdp import sgm_rdp
from aggregator.privacy.strict import masked_sensitivity, sparse_norm_bound, strict_coefficient

__all__ = [
    "CLIP_MODES",
    "CONVERSIONS",
    "MECHANISMS",
    "MODES",
    "NOISE_POSITIONS",
    "QUANTIZER_SCALES",
    "RECORD_ACCOUNTANTS",
    "RELATIONS",
    "BudgetGuard",
    "EpsilonResult",
    "EventError",
    "LaplaceRecordEvent",
    "Ledger",
    "LedgerError",
    "OrderAtEdgeWarning",
    "PrivacyAccountant",
    "RecordAccountant",
    "RecordEpsilon",
    "RecordEvent",
    "SupportsEpsilon",
    "TornLineWarning",
    "UploadEvent",
    "calibrate_noise_multiplier",
    "compose",
    "convert",
    "device_level_epsilon",
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
    "record_epsilon_for",
    "sgm_rdp",
    "sparse_norm_bound",
    "strict_coefficient",
    "upload_coefficient",
]
