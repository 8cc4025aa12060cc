"""Aggregator: decoding, aggregation, privacy accounting and the EE-DP-FL solver."""
