"""The aggregator: the one round loop and its device interface, decoding, aggregation,
evaluation, the run's summary, the EE-DP-FL solver and the peers' planners; ``lab/``: the
aggregator process of a lab run (docs/architecture.md)."""
