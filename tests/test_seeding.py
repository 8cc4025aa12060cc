"""The experiment's generators: one state per purpose, device and round, whichever way the
seed words reach :class:`numpy.random.SeedSequence`."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.core.seeding import Stream, experiment_generator

WORDS = [0, 1, 7, 999, 2**31, 2**32 - 1, 2**32, 2**40 + 3, 2**64 + 5]


def _listed(seed: int, stream: Stream, device: int, round_index: int) -> np.random.Generator:
    """The generator as first written: the seed words handed over as a list of ints."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([seed, int(stream), device, round_index]))
    )


@pytest.mark.parametrize("stream", list(Stream))
def test_same_state_as_the_listed_seed_words(stream: Stream) -> None:
    for seed in WORDS:
        for device in (*WORDS, np.int64(5), np.uint32(7)):
            for round_index in (0, 3, 2**32 + 1):
                got = experiment_generator(seed, stream, int(device), round_index)
                want = _listed(seed, stream, int(device), round_index)
                assert got.bit_generator.state == want.bit_generator.state
                assert got.integers(0, 2**63, 4).tolist() == want.integers(0, 2**63, 4).tolist()


def test_numpy_integers_as_indices() -> None:
    got = experiment_generator(3, Stream.CHANNEL, np.int64(12), np.int64(4))  # type: ignore[arg-type]
    assert got.bit_generator.state == _listed(3, Stream.CHANNEL, 12, 4).bit_generator.state


def test_negative_index_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        experiment_generator(0, Stream.MINIBATCH, -1, 0)
