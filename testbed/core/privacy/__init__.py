"""Privacy accounting for the aggregator (no torch): events, RDP math, two accountings,
a per-device accountant, a durable ledger and a budget guard; and the record-level unit
(Poisson-subsampled Gaussians composed with dp-accounting). See ``docs/privacy.md``."""

from testbed.core.privacy.accountants.accountant import (
    MODES,
    PrivacyAccountant,
    epsilon_for,
    upload_coefficient,
)
from testbed.core.privacy.accountants.budget import BudgetGuard
from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.privacy.accountants.record_planning import (
    calibrate_noise_multiplier,
    record_epsilon_for,
)
from testbed.core.privacy.analysis.paper import kappa, paper_coefficient
from testbed.core.privacy.analysis.rdp import (
    OrderAtEdgeWarning,
    gaussian_epsilon_closed_form,
)
from testbed.core.privacy.analysis.record_device_level import device_level_epsilon
from testbed.core.privacy.analysis.record_rdp import sgm_rdp
from testbed.core.privacy.analysis.strict import strict_coefficient
from testbed.core.privacy.events import (
    EventError,
    UploadEvent,
)
from testbed.core.privacy.ledger import Ledger, LedgerError, TornLineWarning, rebuild_accountant
from testbed.core.privacy.record_events import LaplaceRecordEvent, RecordEvent

__all__ = [
    "MODES",
    "BudgetGuard",
    "EventError",
    "LaplaceRecordEvent",
    "Ledger",
    "LedgerError",
    "OrderAtEdgeWarning",
    "PrivacyAccountant",
    "RecordAccountant",
    "RecordEvent",
    "TornLineWarning",
    "UploadEvent",
    "calibrate_noise_multiplier",
    "device_level_epsilon",
    "epsilon_for",
    "gaussian_epsilon_closed_form",
    "kappa",
    "paper_coefficient",
    "rebuild_accountant",
    "record_epsilon_for",
    "sgm_rdp",
    "strict_coefficient",
    "upload_coefficient",
]
