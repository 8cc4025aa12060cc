"""Which devices a round asks (device sampling)."""

from __future__ import annotations

import secrets

from testbed.core.config.experiment import ExperimentConfig
from testbed.core.seeding import Stream, experiment_generator


def round_devices(cfg: ExperimentConfig, t: int) -> set[int]:
    """Devices asked to upload in round ``t``: every device; for 004 the ``b`` next in round
    robin and for 002 ``r`` drawn with the OS CSPRNG (``clients_per_round``); for the other
    schemes ``sample_devices`` drawn uniformly without replacement from the experiment seed
    (stream DEVICE_SAMPLING, the same after a resume; no amplification by device sampling is
    credited)."""
    n = cfg.devices
    if cfg.sample_devices is not None and cfg.sample_devices < n:
        rng = experiment_generator(cfg.seed, Stream.DEVICE_SAMPLING, 0, t)
        return {int(i) for i in rng.choice(n, size=cfg.sample_devices, replace=False)}
    k = cfg.clients_per_round
    if k is None or k >= n:
        return set(range(n))
    if cfg.scheme == "fedsgd-dpc":
        return {(t * k + j) % n for j in range(k)}
    return set(secrets.SystemRandom().sample(range(n), k))
