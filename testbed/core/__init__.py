"""The shared core: what the aggregator, the edge agent and the driving layer all use
(config, data, models, masks, seeding, settings, protocol and control-plane sockets and keys,
privacy accounting and ledger, run directory). It imports only ``radio`` and third-party
packages (docs/architecture.md)."""
