"""With a noiseless channel the testbed's aggregate equals plain FedAvg.

The reference loop below is written independently of the runner: it trains deep copies of
the model with ``torch.optim.SGD`` and averages the devices' *models* (state dicts), while
the testbed sends differentials ``(w - w_i)/lr`` as analog symbols over the link, inverts
the channel and applies ``w - lr * mean(g_i)``. Only the seed streams (which data split,
which minibatches) are shared, since "the same seed" must mean the same draws.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from testbed.core.config.loader import load_experiment
from testbed.core.models import build_model, get_flat
from testbed.core.run_setup import prepare_data
from testbed.core.runs.rundir import RunDir
from testbed.core.seeding import Stream, experiment_generator
from testbed.runner import run_experiment


def reference_fedavg(cfg) -> np.ndarray:  # type: ignore[no-untyped-def]
    data, parts = prepare_data(cfg)
    init_seed = int(experiment_generator(cfg.seed, Stream.MODEL_INIT).integers(2**31))
    global_model = build_model(cfg.model, (1, 28, 28), init_seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    for t in range(cfg.rounds):
        states = []
        for i, idx in enumerate(parts):
            local = copy.deepcopy(global_model)
            opt = torch.optim.SGD(local.parameters(), lr=cfg.lr)
            x = torch.from_numpy(data.x_train[idx])
            y = torch.from_numpy(data.y_train[idx])
            rng = experiment_generator(cfg.seed, Stream.MINIBATCH, i, t)
            for _ in range(cfg.local_steps):
                b = torch.from_numpy(
                    rng.choice(len(y), size=min(cfg.batch_size, len(y)), replace=False)
                )
                opt.zero_grad()
                loss_fn(local(x[b]), y[b]).backward()
                opt.step()
            states.append(local.state_dict())
        avg = {k: sum(s[k] for s in states) / len(states) for k in states[0]}
        global_model.load_state_dict(avg)
    return get_flat(global_model)


def test_noiseless_channel_equals_reference_fedavg(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    cfg = load_experiment(
        None,
        [*tiny_overrides, "model=mnist-cnn", "noiseless=true", "clip.mode=none", "fading=rayleigh"],
    )
    run_experiment(cfg, tmp_path / "run")
    ckpt = RunDir(tmp_path / "run").load_checkpoint()
    assert ckpt is not None
    last, w_testbed, _ = ckpt
    assert last == cfg.rounds - 1
    w_ref = reference_fedavg(cfg)
    init = get_flat(build_model(cfg.model, (1, 28, 28), 0))
    assert np.linalg.norm(w_ref - init) > 1e-2, "reference did not train"
    np.testing.assert_allclose(w_testbed, w_ref, rtol=1e-4, atol=2e-6)


def test_noisy_channel_differs_from_reference(tmp_path: Path, tiny_overrides: list[str]) -> None:
    """Guards the exactness test: the comparison is sensitive to channel noise."""
    cfg = load_experiment(None, [*tiny_overrides, "clip.mode=none", "snr_db=10", "rounds=1"])
    run_experiment(cfg, tmp_path / "run")
    ckpt = RunDir(tmp_path / "run").load_checkpoint()
    assert ckpt is not None
    assert np.max(np.abs(ckpt[1] - reference_fedavg(cfg))) > 1e-4
