"""Orchestration and shared core of the DP-FL radio testbed."""

__version__ = "0.1.0"
