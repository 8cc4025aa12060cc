"""The privacy accountants: state that composes a device's events as they happen.

The device unit's :class:`~testbed.core.privacy.accountants.accountant.PrivacyAccountant`
and :class:`~testbed.core.privacy.accountants.budget.BudgetGuard`; the record unit's
:class:`~testbed.core.privacy.accountants.record_accountant.RecordAccountant` (with its
replay of past runs, :mod:`~testbed.core.privacy.accountants.replay_runs`, over
:mod:`~testbed.core.privacy.accountants.state_trie`) and planner
(:mod:`~testbed.core.privacy.accountants.record_planning`); the independent recomputation
the tests hold them to (:mod:`~testbed.core.privacy.accountants.reference`). The pure math
they use is in :mod:`testbed.core.privacy.analysis`.
"""
