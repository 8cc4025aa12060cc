"""Shared fixtures: a small, learnable IDX data set written by the tests themselves, and a
data cache of the session's own (never the user's)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from radio.uhd_probe import LOOPBACK_ONLY_ENV
from testbed.core.data.cache import CACHE_ENV
from testbed.core.data.idx import write_idx

# Property tests draw the same examples on every run of the default selection, so a landing
# is never blocked by a draw no one asked for; `HYPOTHESIS_PROFILE=explore make test` draws
# fresh ones (what found the PLD engine's overflow; each find is then pinned as an @example).
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config: pytest.Config) -> None:
    """Give SIGINT its default meaning in this process and so in every process a test
    starts. A shell starts a background job (``make test &``, some CI runners) with SIGINT
    ignored, every child inherits that, and Python then installs no KeyboardInterrupt
    handler: the tests that stop a ``testbed`` process with SIGINT would wait in vain. A
    handled signal is reset to the default on ``exec``, an ignored one is not."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Device addresses in tests (192.168.10.x of lab_ota.yaml) are config strings, checked
    # or handed to injected finders; UHD discovery itself may ask only the loopback
    # address, in this process and every process a test starts (the hardware contract,
    # TESTBED_USRP=1, is the exception).
    if os.environ.get("TESTBED_USRP") != "1":
        os.environ[LOOPBACK_ONLY_ENV] = "1"


@pytest.fixture(scope="session", autouse=True)
def session_data_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data cache (:mod:`testbed.core.data.cache`) of this session, in its temporary
    folder, for this process and every process a test starts: no test reads or writes the
    user's cache."""
    folder = tmp_path_factory.mktemp("data-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(folder))
        yield folder


def make_idx_dataset(
    directory: Path, *, n_train: int = 600, n_test: int = 200, seed: int = 0, gz: bool = False
) -> Path:
    """Write MNIST-shaped IDX files whose label is visible in the image.

    Each class has its own random 28x28 template; a sample is its template plus noise, so
    a model can learn the task in a few rounds. Labels are balanced.
    """
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0, 255, size=(10, 28, 28))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % 10
        rng.shuffle(y)
        x = templates[y] * 0.6 + rng.uniform(0, 255 * 0.4, size=(n, 28, 28))
        return x.astype(np.uint8), y.astype(np.uint8)

    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    write_idx(directory / f"train-images-idx3-ubyte{suffix}", x_train)
    write_idx(directory / f"train-labels-idx1-ubyte{suffix}", y_train)
    write_idx(directory / f"t10k-images-idx3-ubyte{suffix}", x_test)
    write_idx(directory / f"t10k-labels-idx1-ubyte{suffix}", y_test)
    return directory


@pytest.fixture(scope="session")
def tiny_idx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with a 600/200-sample MNIST-shaped IDX data set."""
    return make_idx_dataset(tmp_path_factory.mktemp("tiny_idx"))


@pytest.fixture
def tiny_overrides(tiny_idx_dir: Path) -> list[str]:
    """``--set`` overrides for a fast run on the tiny data set."""
    return [
        "dataset=mnist",
        "model=logreg",
        f"data_dir={tiny_idx_dir}",
        "devices=4",
        "rounds=3",
        "local_steps=3",
        "batch_size=16",
        "lr=0.05",
    ]


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one intra-op thread for the test, as runs train (``torch_threads: 1``): small
    batches are about 10x faster than on two contended threads, and a bit-for-bit comparison
    of two ways of computing sees the same products' summation order."""
    import torch  # not at import: the Python 3.10 tests run without torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
