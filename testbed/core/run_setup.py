"""What both ends of a run compute alike from its config: the data set and its split across
devices, the seeded initial model, and every device's uplink and record-level settings (the
aggregator and every edge agent resolve the same values, so nothing of them travels)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from testbed.core.channel_credit import calibration_config, credited_config
from testbed.core.compute import resolve_device
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.data.coded import concatenate, take_rows
from testbed.core.data.datasets import Dataset, load_dataset, load_test_set, load_train_shard
from testbed.core.data.partition import iid_partition, noniid_partition
from testbed.core.extensions import is_import_string, load_user_dataset
from testbed.core.models import build_model, check_record_level_model
from testbed.core.record_schemes import RecordSettings, resolve_record_uplinks
from testbed.core.schemes import DeviceUplink, resolve_uplinks
from testbed.core.seeding import Stream, experiment_generator


def _user_data(cfg: ExperimentConfig, data_dir: str | Path | None,
               required: tuple[str, ...] = ("train", "test")) -> Dataset:
    """An import-string data set: its loader called with ``data_dir`` (``required``: the
    splits that must hold samples)."""
    return load_user_dataset(cfg.dataset, None if data_dir is None else str(data_dir),
                             cfg.extensions_path, required)


def device_directory(cfg: ExperimentConfig, device: int) -> Path:
    """``partition: files``: where device ``device``'s own data is, ``<data_dir>/device-<i>``."""
    return Path(str(cfg.data_dir)).expanduser() / f"device-{device}"


def _files_partition(cfg: ExperimentConfig) -> tuple[Dataset, list[np.ndarray]]:
    """``partition: files``: each device's shard is everything in its own directory
    (:func:`device_directory`), read as ``testbed edge --data-dir`` reads it; the test split
    from ``data_dir`` (capped by ``eval_samples``)."""
    from testbed.core.data.datasets import DatasetNotFoundError

    missing = [str(device_directory(cfg, i)) for i in range(cfg.devices)
               if not device_directory(cfg, i).is_dir()]
    if missing:
        raise DatasetNotFoundError(
            f"partition: 'files' reads device i's data from <data_dir>/device-<i>; missing: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    shards = [prepare_own_shard(cfg, device_directory(cfg, i)) for i in range(cfg.devices)]
    test = prepare_test_data(cfg)
    shapes = {s.x_train.shape[1:] for s in shards} | {test.x_test.shape[1:]}
    if len(shapes) != 1:
        raise ValueError(f"partition: 'files': the devices' and the test samples' shapes "
                         f"differ: {sorted(shapes)}")
    sizes = np.cumsum([0, *(len(s.y_train) for s in shards)])
    parts = [np.arange(sizes[i], sizes[i + 1]) for i in range(cfg.devices)]
    n_classes = max([test.n_classes, *(s.n_classes for s in shards)])
    data = Dataset(test.name, concatenate([s.x_train for s in shards]),
                   np.concatenate([s.y_train for s in shards]), test.x_test, test.y_test,
                   n_classes)
    return data, parts


def prepare_data(cfg: ExperimentConfig) -> tuple[Dataset, list[np.ndarray]]:
    """Load the data set (capped as configured) and split it across devices.

    A data set by import string (``package.module:loader``) is its loader's arrays,
    partitioned and capped as the built-in ones are. ``partition: files``: each device's own
    directory is its shard (:func:`_files_partition`).
    """
    if cfg.partition == "files":
        return _files_partition(cfg)
    if is_import_string(cfg.dataset):
        data = _user_data(cfg, cfg.data_dir)
    else:
        data = load_dataset(cfg.dataset, cfg.resolved_data_dir())
    split_rng = experiment_generator(cfg.seed, Stream.DATA_SPLIT)
    x_train, y_train = data.x_train, data.y_train
    if cfg.train_samples is not None and cfg.train_samples < len(y_train):
        keep = np.sort(split_rng.choice(len(y_train), cfg.train_samples, replace=False))
        x_train, y_train = take_rows(x_train, keep), y_train[keep]
    x_test, y_test = data.x_test, data.y_test
    if cfg.eval_samples is not None and cfg.eval_samples < len(y_test):
        x_test = take_rows(x_test, slice(None, cfg.eval_samples))
        y_test = y_test[: cfg.eval_samples]
    data = Dataset(data.name, x_train, y_train, x_test, y_test, data.n_classes)
    if len(y_train) < cfg.devices:
        raise ValueError(f"devices: {cfg.devices} devices but only {len(y_train)} samples")
    if cfg.partition == "iid":
        parts = iid_partition(len(y_train), cfg.devices, split_rng)
    else:
        parts = noniid_partition(
            y_train,
            cfg.devices,
            split_rng,
            dominant_fraction=cfg.dominant_fraction,
            n_classes=data.n_classes,
        )
    return data, parts


def prepare_own_shard(cfg: ExperimentConfig, directory: Path) -> Dataset:
    """One device's own training data, read from ``directory`` alone (``testbed edge
    --data-dir``): every training row there is the device's shard; the run's partition,
    ``train_samples`` and ``partition`` do not apply (nothing else is read). A data set by
    import string: its loader called with ``directory``, its training split the shard.

    Raises
    ------
    DatasetNotFoundError
        ``directory`` or its training files are missing (named).
    ValueError
        The directory holds no training rows.
    """
    if is_import_string(cfg.dataset):
        full = _user_data(cfg, directory, ("train",))
        empty_x = np.zeros((0, *full.x_train.shape[1:]), dtype=full.x_train.dtype)
        data = Dataset(full.name, full.x_train, full.y_train, empty_x, np.zeros(0, np.int64),
                       full.n_classes)
    else:
        data = load_train_shard(cfg.dataset, directory)
    if len(data.y_train) == 0:
        raise ValueError(f"--data-dir '{directory}': no training rows in its files")
    return data


def prepare_test_data(cfg: ExperimentConfig) -> Dataset:
    """The test set only (capped as configured): what an aggregator evaluates on. Only the
    test files are read: an aggregator host needs no training data. A data set by import
    string: its loader is called and its test split kept (``n_classes`` counts the labels
    of both splits, as on the edges)."""
    if is_import_string(cfg.dataset):
        data = _user_data(cfg, cfg.data_dir, ("test",))
    else:
        data = load_test_set(cfg.dataset, cfg.resolved_data_dir())
    x_test, y_test = data.x_test, data.y_test
    if cfg.eval_samples is not None and cfg.eval_samples < len(y_test):
        x_test = take_rows(x_test, slice(None, cfg.eval_samples))
        y_test = y_test[: cfg.eval_samples]
    return Dataset(data.name, take_rows(x_test, slice(0, 0)), np.zeros(0, np.int64), x_test,
                   y_test, data.n_classes)


def initial_model(
    cfg: ExperimentConfig,
    input_shape: tuple[int, ...],
    device: torch.device | None = None,
    n_classes: int = 10,
) -> torch.nn.Module:
    """The run's model at its seeded initial weights (the same on the aggregator and on
    every edge), on the device it computes on.

    Parameters
    ----------
    cfg
        The run's config.
    input_shape
        One sample's shape, e.g. ``(1, 28, 28)``.
    device
        Where the model computes (training, evaluation); ``None``: ``cfg.compute.device``
        resolved on this host (:func:`testbed.core.compute.resolve_device`, which refuses a
        CUDA device torch does not see). The weights are drawn on the CPU and then moved, so
        they are the same on every device.
    n_classes
        Number of labels K (the data set's ``n_classes``).

    Raises
    ------
    ValueError
        Under record-level privacy, a model per-example clipping cannot handle
        (:func:`testbed.core.models.check_record_level_model`: batch normalisation, named),
        before any work; a model that does not take the data's shape.
    testbed.core.extensions.ExtensionError
        A model by import string that does not import or build.
    """
    if device is None:
        device = resolve_device(cfg.compute.device).torch_device
    init_seed = int(experiment_generator(cfg.seed, Stream.MODEL_INIT).integers(2**31))
    shape = tuple(int(x) for x in input_shape)
    model = build_model(cfg.model, shape, init_seed, n_classes, cfg.extensions_path)
    if cfg.scheme != "fedavg" and cfg.privacy.unit == "record":
        check_record_level_model(model)
    return model.to(device)


def device_settings(
    cfg: ExperimentConfig, hw: HardwareConfig, d: int, dataset_sizes: list[int]
) -> tuple[list[DeviceUplink], list[RecordSettings | None]]:
    """Every device's uplink and (record unit) record-level settings; the same on the
    aggregator and on every edge agent.

    Without a plan, a device's settings depend on the device only through its SNR and its
    number of samples, so they are resolved (and validated, before any work) once per
    distinct ``(snr_db, samples)`` and shared: a population of 10,000 alike devices costs
    one calibration, not 10,000. A plan lists every device and is read as it is.
    """
    credited = credited_config(cfg, hw)  # seeded channel noise is never credited
    cfg = calibration_config(credited, hw)  # estimated links: credited after reception
    if cfg is not credited:
        # The noise alone meets the target; each event still carries the trusted fraction
        # the scheme credits, so the noise measured in the received frame counts afterwards.
        bare = _resolve(cfg, hw, d, dataset_sizes)
        with_credit = _resolve(credited, hw, d, dataset_sizes)
        uplinks = [replace(b, trusted=c.trusted) for b, c in zip(bare[0], with_credit[0],
                                                                  strict=True)]
        records = [None if b is None or c is None else replace(b, credit_channel=c.credit_channel)
                   for b, c in zip(bare[1], with_credit[1], strict=True)]
        return uplinks, records
    return _resolve(cfg, hw, d, dataset_sizes)


def _resolve(
    cfg: ExperimentConfig, hw: HardwareConfig, d: int, dataset_sizes: list[int]
) -> tuple[list[DeviceUplink], list[RecordSettings | None]]:
    """:func:`device_settings` for a config whose channel credit is already decided."""
    unit = None if cfg.scheme == "fedavg" else cfg.privacy.unit
    n = len(dataset_sizes)
    snrs = cfg.snr_db_per_device()
    keys = [(float(snrs[i]), int(dataset_sizes[i])) for i in range(n)]
    first: dict[tuple[float, int], int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    chosen = list(first.values()) if cfg.plan is None else list(range(n))
    pairs: list[tuple[DeviceUplink, RecordSettings | None]]
    if unit == "record":
        pairs = list(resolve_record_uplinks(cfg, hw, d, dataset_sizes, devices=chosen))
    else:
        pairs = [(up, None) for up in resolve_uplinks(cfg, hw, d, devices=chosen)]
    if cfg.plan is not None:
        return [up for up, _ in pairs], [rs for _, rs in pairs]
    by_key = {keys[i]: pair for i, pair in zip(chosen, pairs, strict=True)}
    return [by_key[k][0] for k in keys], [by_key[k][1] for k in keys]
