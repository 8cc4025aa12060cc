"""What a testbed process does to itself: BLAS threads (:mod:`~testbed.core.process.blas_threads`),
child processes that die with their parent (:mod:`~testbed.core.process.child_process`), its
CPU clock (:mod:`~testbed.core.process.process_clock`), stage timings
(:mod:`~testbed.core.process.stage_timer`) and the garbage collector at start-up
(:mod:`~testbed.core.process.startup_gc`).
"""
