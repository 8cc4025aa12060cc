"""``testbed sweep``: a grid over experiment config keys, one ordinary run directory per cell,
run as Ray tasks (local Ray by default, a running cluster by address).

Python API::

    from testbed.sweep import load_sweep, run_sweep
    result = run_sweep(load_sweep("testbed/config/sweeps/example.yaml"), "sweeps/example")
    result.rows          # one dict per cell: grid values, status, accuracy, epsilon, energy
    result.exit_code     # 0 every cell has a result, 1 some failed, 130 interrupted

See ``docs/sweep.md``.
"""

from testbed.sweep.driver import OK_STATUSES, SweepResult, run_sweep
from testbed.sweep.results import RESULT_COLUMNS
from testbed.sweep.spec import SweepSpec, load_sweep, parse_sweep

__all__ = [
    "OK_STATUSES",
    "RESULT_COLUMNS",
    "SweepResult",
    "SweepSpec",
    "load_sweep",
    "parse_sweep",
    "run_sweep",
]
