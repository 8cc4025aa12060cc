"""The device: local training, clip -> noise -> compress -> scale (the uplink encoder), the
energy meter, the device worker; ``lab/``: the edge agent process of a lab run
(docs/architecture.md)."""
