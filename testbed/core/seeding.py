"""Random generators: reproducible ones from the experiment seed, secure ones for privacy.

Every experiment draw (data split, model init, minibatches, the simulated channel) takes an
explicit generator spawned from one root seed and a purpose, device and round, so a resumed
run redraws exactly what an uninterrupted one would. Privacy noise and secret batch
sampling never come from here: they are drawn from the OS CSPRNG in
:mod:`testbed.core.noise` (a PCG generator seeded from the CSPRNG would not be a CSPRNG).
"""

from __future__ import annotations

import secrets
from enum import IntEnum

import numpy as np

#: Entropy words are 32-bit: a smaller int is one word.
_WORD = 2**32


class Stream(IntEnum):
    """Purposes of reproducible streams; a value never changes meaning."""

    DATA_SPLIT = 1
    MODEL_INIT = 2
    MINIBATCH = 3
    CHANNEL = 4
    QUANTIZER = 5
    EVAL = 6
    DEVICE_SAMPLING = 7
    #: the shared slot of an over-the-air (aircomp) round: its receiver noise when seeded
    AIR_SLOT = 8


def experiment_generator(
    seed: int, stream: Stream, device: int = 0, round_index: int = 0
) -> np.random.Generator:
    """Generator for one purpose, device and round, spawned from the experiment seed.

    Parameters
    ----------
    seed
        The experiment's root seed (``>= 0``).
    stream
        Purpose of the draws.
    device, round_index
        Indices; ``0`` when the purpose is not per device or per round.
    """
    if seed < 0 or device < 0 or round_index < 0:
        raise ValueError(
            f"seed, device and round must be >= 0, got {seed}, {device}, {round_index}"
        )
    words = (seed, int(stream), device, round_index)
    # SeedSequence reads each int below 2**32 (0 included) as one uint32 word; given those
    # words as a uint32 array it skips its per-int conversion in Python and mixes the same
    # entropy, so the generator's state is the same (tests/test_seeding.py).
    entropy = np.array(words, dtype=np.uint32) if max(words) < _WORD else list(words)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def new_run_secret() -> str:
    """A fresh 256-bit run secret (hex) for deriving sparsification masks."""
    return secrets.token_hex(32)
