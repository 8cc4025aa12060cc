"""Brute force: 004's Laplace reply on every neighbouring pair of a tiny universe of records.

A five-record universe (three of class 0, two of class 1, the same input for one of each so
their gradients are opposite) and a linear model (d = 6). Every non-empty subset is a data
set the device could hold; the mechanism's noiseless output on each comes from the code path
a run uses (:func:`testbed.core.record_schemes.resolve_record_uplinks` for the scale and the public
``D_i``, :meth:`RecordTrainer.train_laplace` for the mean). For each neighbouring pair under
add/remove and replace-one, ``Lap(mu, s)`` against ``Lap(mu', s)`` (per coordinate) is
exactly ``eps0 = ||mu - mu'||_1 / s``-DP (the privacy loss reaches it with probability 1/2^d
at least) and, at ``delta``, ``(eps0 + 2 ln(1 - delta))``-DP: that is exact for one
coordinate (``delta(eps) = 1 - exp((eps - eps0) / 2)``, checked against dp-accounting below)
and the one-coordinate pair dominates any split of the same l1 distance over coordinates
(the premise of ``dp_accounting.LaplaceDpEvent`` for l1 sensitivity). The worst pair must
stay within both the pure-DP figure the event claims and the (epsilon, delta) the enforced
accountant reports.

The old trainer divided by the records it saw; :func:`_old_mean` keeps that formula so the
test shows what it would have caught (1.5x at D = 3 for the partitioned shard's neighbours,
3x over the universe).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from edge_device.device_worker import train_device
from edge_device.dp_trainer import RecordTrainer
from edge_device.energy_meter import ModelMeter
from testbed.core.config.loader import load_experiment, load_hardware
from testbed.core.privacy import LaplaceRecordEvent, RecordAccountant
from testbed.core.record_schemes import RecordSettings, resolve_record_uplinks

DELTA = 1e-5
XI = 0.05  # l1 clip: every per-example gradient here has l1 norm >= 0.5, so all are clipped
#: (input, label): A0-A2 class 0, B0-B1 class 1; A0 and B0 share an input.
UNIVERSE = [((1.0, 0.0), 0), ((0.9, 0.1), 0), ((1.1, -0.2), 0), ((1.0, 0.0), 1),
            ((0.5, 0.5), 1)]
SHARD = (0, 1, 2)  # the device's data set as partitioned: D_i = 3, public
CONFIG = ["scheme=fedsgd-dpc", "local_steps=1", "privacy.noise=per-step",
          "privacy.noise_distribution=laplace", "devices=1", "rounds=1",
          f"privacy.example_clip={XI}", "privacy.epsilon=1.0"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 2))


def _data(subset: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([UNIVERSE[i][0] for i in subset], dtype=np.float32).reshape(-1, 1, 1, 2)
    y = np.array([UNIVERSE[i][1] for i in subset], dtype=np.int64)
    return x, y


def _settings(relation: str) -> RecordSettings:
    cfg = load_experiment(None, [*CONFIG, f"privacy.relation={relation}"])
    hw = load_hardware(cfg.hw_config)
    [(_, rs)] = resolve_record_uplinks(cfg, hw, 6, [len(SHARD)])
    return rs


def _mean(model: torch.nn.Module, subset: tuple[int, ...], rs: RecordSettings) -> np.ndarray:
    """The code's noiseless output on data set ``subset`` (float64, ``(6,)``)."""
    trainer = RecordTrainer(model, *_data(subset))
    return trainer.train_laplace(np.zeros(6, np.float32), lr=0.1, example_clip=rs.example_clip,
                                 laplace_scale=0.0, normaliser=rs.dataset_size).differential


def _old_mean(model: torch.nn.Module, subset: tuple[int, ...], rs: RecordSettings) -> np.ndarray:
    """The old formula: the clipped sum over the records seen, divided by their number."""
    trainer = RecordTrainer(model, *_data(subset))
    x, y = _data(subset)
    total, _, _ = trainer.clipped_sum(torch.from_numpy(x), torch.from_numpy(y),
                                      rs.example_clip, norm=1)
    return total.double().numpy() / len(subset)


def _pairs(relation: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every neighbouring pair of non-empty subsets of the universe."""
    sets = [s for k in range(1, len(UNIVERSE) + 1)
            for s in itertools.combinations(range(len(UNIVERSE)), k)]
    out = []
    for a, b in itertools.combinations(sets, 2):
        diff = set(a) ^ set(b)
        if relation == "add-remove" and len(diff) == 1:
            out.append((a, b))
        if relation == "replace-one" and len(a) == len(b) and len(diff) == 2:
            out.append((a, b))
    return out


def _reported(rs: RecordSettings) -> float:
    acc = RecordAccountant("pld", DELTA, relation=rs.relation)
    acc.add(LaplaceRecordEvent(round=0, device=0, scale=rs.laplace_scale,
                               example_clip=rs.example_clip, dataset_size=rs.dataset_size,
                               relation=rs.relation))
    return acc.epsilon(0).epsilon


def _at_delta(eps0: float) -> float:
    """Epsilon at :data:`DELTA` of a one-coordinate Laplace pair that is ``eps0``-DP."""
    return max(0.0, eps0 + 2.0 * math.log1p(-DELTA))


def _worst(fn, rs: RecordSettings, pairs) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """``(worst l1 distance, worst pure epsilon = distance / s)`` over ``pairs``."""
    model = _model()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    means = {}
    for pair in pairs:
        for s in pair:
            if s not in means:
                model.load_state_dict(init)
                means[s] = fn(model, s, rs)
    dist = max(float(np.abs(means[a] - means[b]).sum()) for a, b in pairs)
    return dist, dist / rs.laplace_scale


@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_worst_pair_epsilon_is_within_the_reported(relation: str) -> None:
    rs = _settings(relation)
    assert rs.dataset_size == len(SHARD)
    reported = _reported(rs)
    assert reported <= 1.0  # the enforced target
    factor = 2.0 if relation == "replace-one" else 1.0
    pure = factor / rs.target_noise_multiplier  # the event's pure-DP claim, factor / b
    dist, eps0 = _worst(_mean, rs, _pairs(relation))
    assert dist <= factor * XI / len(SHARD)  # the sensitivity the accounting assumes
    assert eps0 <= pure
    assert _at_delta(eps0) <= reported
    assert eps0 >= 0.999 * pure  # tight: the clip is active and B0's gradient is -A0's


def test_one_coordinate_laplace_at_delta_matches_dp_accounting() -> None:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    for b in (0.5, 1 / 0.995, 3.0):
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
        acc.compose(dp_accounting.LaplaceDpEvent(b))
        assert acc.get_epsilon(DELTA) == pytest.approx(_at_delta(1 / b), abs=2e-5)


def test_old_formula_would_have_failed() -> None:
    """Dividing by the realized size: add/remove moves the mean by up to 2 xi/(D+1)."""
    rs = _settings("add-remove")
    reported = _reported(rs)
    shard_pairs = [p for p in _pairs("add-remove") if SHARD in p]
    _, eps_shard = _worst(_old_mean, rs, shard_pairs)
    assert _at_delta(eps_shard) > 1.45 * reported  # 2D/(D+1) = 1.5 at D = 3: SHARD + {B0}
    _, eps_all = _worst(_old_mean, rs, _pairs("add-remove"))
    assert _at_delta(eps_all) > 2.9 * reported  # {A0} + {B0}: the mean goes from a to 0


def test_device_worker_divides_by_the_public_size() -> None:
    """The path a run and a lab edge take (``train_device``) divides by the settings'
    ``dataset_size``, whatever the number of records the trainer holds."""
    cfg = load_experiment(None, CONFIG)
    rs = dataclasses.replace(_settings("add-remove"), laplace_scale=0.0)
    model = _model()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    every = tuple(range(len(UNIVERSE)))  # 5 records, D_i = 3
    trainer = RecordTrainer(model, *_data(every))
    out = train_device(cfg, trainer, rs, ModelMeter(0.0), 0, np.zeros(6, np.float32), 0)
    model.load_state_dict(init)
    x, y = _data(every)
    total, _, _ = trainer.clipped_sum(torch.from_numpy(x), torch.from_numpy(y), XI, norm=1)
    np.testing.assert_allclose(out.differential, total.double().numpy() / 3, rtol=1e-5)  # not / 5


def test_normaliser_is_required_and_checked() -> None:
    trainer = RecordTrainer(_model(), *_data(SHARD))
    w = np.zeros(6, np.float32)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="normaliser"):
            trainer.train_laplace(w, lr=0.1, example_clip=XI, laplace_scale=0.0,
                                  normaliser=bad)  # type: ignore[arg-type]
    out = trainer.train_laplace(w, lr=0.1, example_clip=XI, laplace_scale=0.2, normaliser=7)
    assert out.noise_multiplier == pytest.approx(0.2 * 7 / XI)
