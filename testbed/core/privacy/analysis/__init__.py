"""The privacy analysis: pure functions of a mechanism's parameters (no state, no files).

RDP and its conversions (:mod:`~testbed.core.privacy.analysis.rdp`), the paper's and the
strict upload coefficients (:mod:`~testbed.core.privacy.analysis.paper`,
:mod:`~testbed.core.privacy.analysis.strict`), exact sums
(:mod:`~testbed.core.privacy.analysis.exact_sum`), the record unit's subsampled Gaussians
composed with dp-accounting (:mod:`~testbed.core.privacy.analysis.record_rdp`,
:mod:`~testbed.core.privacy.analysis.record_compose`,
:mod:`~testbed.core.privacy.analysis.record_epsilon`,
:mod:`~testbed.core.privacy.analysis.record_calibration`,
:mod:`~testbed.core.privacy.analysis.pld_bounded`,
:mod:`~testbed.core.privacy.analysis.record_device_level`), epsilon over channel gains
(:mod:`~testbed.core.privacy.analysis.curve`) and AirComp's noise shares
(:mod:`~testbed.core.privacy.analysis.aircomp_noise`). The stateful accountants that use
them are in :mod:`testbed.core.privacy.accountants`.
"""
