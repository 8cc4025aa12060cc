"""The data cache: bit-for-bit the arrays computed without it, damaged entries rebuilt, a
folder that cannot be written tolerated; and a run's ``startup_s``."""

from __future__ import annotations

import json
import mmap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from testbed.core.data import cache
from testbed.core.data.cache import CACHE_ENV, cache_root, read_entry, write_entry
from testbed.core.data.coded import CodedImages
from testbed.core.data.datasets import Dataset, load_dataset, load_test_set
from testbed.core.process.process_clock import process_age_s
from tests.conftest import make_idx_dataset

SPLITS = ("x_train", "y_train", "x_test", "y_test")


def _same(a: Dataset, b: Dataset) -> None:
    """Equal bit for bit: dtype, shape and bytes of every array (the images decoded)."""
    for key in SPLITS:
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), key


def _entries(folder: Path) -> list[Path]:
    return sorted((folder / "data").glob("*.json"))


def _mapped(array: np.ndarray) -> bool:
    """``array`` is a view of a memory-mapped file."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base is not None


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return make_idx_dataset(tmp_path / "idx", n_train=300, n_test=100, gz=True)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder of this test's own."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _uncached(name: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Dataset:
    with monkeypatch.context() as mp:
        mp.setenv(CACHE_ENV, "")
        return load_dataset(name, data_dir)


def test_cached_equals_uncached_bit_for_bit(
    data_dir: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _uncached("mnist", data_dir, monkeypatch)
    assert not (folder / "data").exists()  # an empty variable: no cache at all
    first = load_dataset("mnist", data_dir)  # computes and writes
    assert len(_entries(folder)) == 2  # train and test
    second = load_dataset("mnist", data_dir)  # read back, memory-mapped
    _same(plain, first)
    _same(plain, second)
    assert isinstance(second.x_train, CodedImages)  # the 8-bit codes and their table
    assert _mapped(second.x_train.codes) and _mapped(second.y_test)
    assert second.x_train.codes.flags.writeable
    # copy-on-write: a write stays in this process, the cached file keeps its bytes
    second.x_train.codes[0] = 7
    _same(plain, load_dataset("mnist", data_dir))


def test_test_split_alone_and_the_split_entries(
    data_dir: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as mp:
        mp.setenv(CACHE_ENV, "")
        plain = load_test_set("mnist", data_dir)
    assert load_test_set("mnist", data_dir).x_train.shape == (0, 1, 28, 28)
    assert [p.name.split("-")[1] for p in _entries(folder)] == ["test"]
    _same(plain, load_test_set("mnist", data_dir))


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "manifest", "missing"])
def test_damaged_entry_is_detected_and_rebuilt(
    data_dir: Path, folder: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    plain = _uncached("mnist", data_dir, monkeypatch)
    load_dataset("mnist", data_dir)
    manifest = next(p for p in _entries(folder) if "-train-" in p.name)
    stem = manifest.with_suffix("")
    images = stem.with_name(f"{stem.name}.codes.npy")
    good = images.read_bytes()
    raw = bytearray(good)
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x10  # one bit of one pixel
        images.write_bytes(bytes(raw))
    elif damage == "truncate":
        images.write_bytes(bytes(raw[: len(raw) - 4096]))
    elif damage == "empty":
        images.write_bytes(b"")
    elif damage == "manifest":
        manifest.write_text("{not json")
    else:
        images.unlink()
    assert read_entry(stem) is None
    again = load_dataset("mnist", data_dir)
    _same(plain, again)
    assert images.read_bytes() == good  # rewritten
    assert read_entry(stem) is not None


def test_checksum_sees_a_moved_page() -> None:
    pages = np.arange(4 * 1024, dtype=np.uint32).reshape(4, 1024)  # four 4 KiB pages
    swapped = pages[[1, 0, 2, 3]]
    assert cache._digest(pages) != cache._digest(swapped)
    assert cache._digest(pages) == cache._digest(pages.copy())
    tail = np.arange(1030, dtype=np.uint8)  # a part page
    changed = tail.copy()
    changed[-1] ^= 1
    assert cache._digest(tail) != cache._digest(changed)


def test_a_changed_source_file_is_a_new_entry(
    data_dir: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_dataset("mnist", data_dir)
    make_idx_dataset(data_dir, n_train=300, n_test=100, seed=1, gz=True)
    plain = _uncached("mnist", data_dir, monkeypatch)
    _same(plain, load_dataset("mnist", data_dir))
    assert len(_entries(folder)) == 4


def test_a_folder_that_cannot_be_written_falls_back(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _uncached("mnist", data_dir, monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))  # mkdir fails, even as root
    _same(plain, load_dataset("mnist", data_dir))


def test_racing_writers_leave_one_intact_entry(
    data_dir: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _uncached("mnist", data_dir, monkeypatch)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: load_dataset("mnist", data_dir), range(8)))
    for data in results:
        _same(plain, data)
    names = sorted(p.name for p in (folder / "data").iterdir())
    assert not [n for n in names if n.startswith(".")]  # no temporary file left
    assert len(names) == 8  # train and test: a manifest, image codes, their table, labels


def test_write_then_read_any_arrays(tmp_path: Path) -> None:
    arrays = {"a": np.arange(5000, dtype=np.float64).reshape(50, 100),
              "b": np.zeros((0, 3), dtype=np.int16)}
    write_entry(tmp_path / "e", arrays)
    back = read_entry(tmp_path / "e")
    assert back is not None and set(back) == {"a", "b"}
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)
    manifest = json.loads((tmp_path / "e.json").read_text())
    assert manifest["arrays"]["a"]["shape"] == [50, 100]


def test_cache_root_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.setenv(CACHE_ENV, "")
    assert cache_root() is None
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "dpfl-testbed"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/not/allowed")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "dpfl-testbed"


def test_process_age_and_the_runs_startup(
    tiny_overrides: list[str], tmp_path: Path
) -> None:
    from testbed.core.config.loader import load_experiment
    from testbed.runner import run_experiment

    age = process_age_s()
    if age is None:
        pytest.skip("no process start time on this system")
    assert 0 < age < 7 * 24 * 3600
    later = process_age_s()
    assert later is not None and later >= age
    cfg = load_experiment(None, [*tiny_overrides, "rounds=1"])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    assert later - 0.001 <= summary["startup_s"] <= (process_age_s() or 0) + 0.001
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["startup_s"] == summary["startup_s"]
