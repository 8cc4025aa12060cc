"""A run on disk and what keeps it whole: the run directory
(:mod:`~testbed.core.runs.rundir`, its first files :mod:`~testbed.core.runs.run_metadata`),
the uploads kept of the round under way (:mod:`~testbed.core.runs.inflight`), the checks a
resume makes (:mod:`~testbed.core.runs.recovery`), durable file-system changes
(:mod:`~testbed.core.runs.durable`), the stop signals (:mod:`~testbed.core.runs.interrupts`),
the errors that end a run with a named outcome (:mod:`~testbed.core.runs.run_errors`) and
the fault injection of the crash tests (:mod:`~testbed.core.runs.faults`).
"""
