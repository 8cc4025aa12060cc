"""The edge agent's error: why this edge cannot take part in a run.

Its own module so that every part of the agent (set-up, transmission, how it ends) raises
the same error without importing the agent (:mod:`edge_device.lab.agent`) itself.
"""

from __future__ import annotations


class EdgeError(RuntimeError):
    """The edge cannot take part (bad state directory, config it cannot run, no radio)."""
