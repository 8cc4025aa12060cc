"""A new run directory's first files: the resolved configs, the run secret and
``meta.json``."""

from __future__ import annotations

import json
import platform
import time

import numpy as np
import torch

from testbed.core.channel_credit import channel_noise_source
from testbed.core.compute import ResolvedDevice, resolve_device
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.link import link_name
from testbed.core.config.loader import dump_yaml
from testbed.core.extensions import extension_facts
from testbed.core.radio_fallback import emulation_facts
from testbed.core.runs.recovery import config_pin
from testbed.core.runs.rundir import RunDir
from testbed.core.seeding import Stream, new_run_secret
from testbed.core.version import __version__


def write_metadata(
    rundir: RunDir,
    cfg: ExperimentConfig,
    hw: HardwareConfig,
    *,
    compute: ResolvedDevice | None = None,
) -> None:
    """Write a new run's ``config.yaml``, ``hw_config.yaml``, ``run_secret`` (mode 0600)
    and ``meta.json`` (versions, seed streams, where privacy noise and sampling come from,
    where this process's model computes, the config pin checked on resume).

    ``compute``: ``cfg.compute.device`` as resolved by the caller; ``None``: resolved here
    (:func:`testbed.core.compute.resolve_device`, which refuses a CUDA device torch does not
    see, before any file is written).

    A model or data set by import string is imported here (an
    :class:`~testbed.core.extensions.ExtensionError` if it does not import) and recorded
    under ``extensions``: the string, the module's file, its package's version and the
    file's sha256.
    """
    compute = compute if compute is not None else resolve_device(cfg.compute.device)
    extensions = extension_facts(cfg.model, cfg.dataset, cfg.extensions_path,
                                 cfg.scheme_class)
    rundir.write_text("config.yaml", dump_yaml(cfg))
    rundir.write_text("hw_config.yaml", dump_yaml(hw))
    rundir.write_text("run_secret", new_run_secret() + "\n", mode=0o600)
    meta = {
        "testbed_version": __version__,
        "seed": cfg.seed,
        "seed_streams": {s.name: int(s) for s in Stream},
        "link": link_name(cfg, hw),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "host": platform.node(),
        "privacy_noise_source": (
            "artificial privacy noise and secret Poisson batch sampling: OS CSPRNG (never "
            "the experiment seed)"
        ),
        "device_sampling_source": (
            "experiment seed (stream DEVICE_SAMPLING): reproducible, no amplification by "
            "device sampling credited"
            if cfg.sample_devices is not None
            else "OS CSPRNG (zcdp-secagg's r of n), no amplification by device sampling credited"
            if cfg.clients_per_round is not None and cfg.scheme == "zcdp-secagg"
            else "round robin (fedsgd-dpc's b of N)"
            if cfg.clients_per_round is not None
            else "none: every device every round"
        ),
        "channel_noise_source": channel_noise_source(cfg, hw),
        # where this process trains and evaluates (a lab's edges resolve their own)
        "compute": compute.metadata(),
    }
    if extensions:  # only for import strings
        meta["extensions"] = extensions
    radios = emulation_facts(hw)
    if radios is not None:  # loud: a run on emulated radios says so first
        meta = {"radios": radios, **meta}
    meta["config_pin"] = config_pin(cfg, hw)  # checked on resume (testbed.core.runs.recovery)
    rundir.write_text("meta.json", json.dumps(meta, indent=2) + "\n")
