"""Accounting, planners and protocols of the peer systems of the source papers (000, 002, 004)."""
