"""Privacy accounting for the aggregator (no torch): events, RDP math, two accountings,
a per-device accountant, a durable ledger and a budget guard; and the record-level unit
(Poisson-subsampled Gaussians composed with dp-accounting). See ``docs/privacy.md``."""

from testbed.core.privacy.accountant import (
    MODES,
    NOISE_POSITIONS,
    EpsilonResult,
    PrivacyAccountant,
    epsilon_for,
    upload_coefficient,
)
from testbed.core.privacy.budget import BudgetGuard, SupportsEpsilon
from testbed.core.privacy.events import (
    CLIP_MODES,
    MECHANISMS,
    QUANTIZER_SCALES,
    EventError,
    UploadEvent,
)
from testbed.core.privacy.ledger import Ledger, LedgerError, TornLineWarning, rebuild_accountant
from testbed.core.privacy.paper import kappa, paper_coefficient
from testbed.core.privacy.rdp import (
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
from testbed.core.privacy.record_accountant import RecordAccountant
from testbed.core.privacy.record_device_level import device_level_epsilon
from testbed.core.privacy.record_epsilon import RECORD_ACCOUNTANTS, RecordEpsilon
from testbed.core.privacy.record_events import RELATIONS, LaplaceRecordEvent, RecordEvent
from testbed.core.privacy.record_planning import calibrate_noise_multiplier, record_epsilon_for
from testbed.core.privacy.record_rdp import sgm_rdp
from testbed.core.privacy.strict import masked_sensitivity, sparse_norm_bound, strict_coefficient

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
