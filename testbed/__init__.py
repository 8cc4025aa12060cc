"""Orchestration (CLI, in-process runner, launch, sweeps, reports) and the shared core of
the DP-FL radio testbed; the aggregator and the edge agent live in ``aggregator/`` and
``edge_device/`` (docs/architecture.md)."""

from testbed.core.version import __version__

__all__ = ["__version__"]
