"""The aggregator's state of one run: configs, run directory, global model, every device's
settings, the privacy book and the evaluation data.

The same object serves ``testbed run`` (devices in this process) and the lab aggregator
(devices are edge agents): it holds nothing of the devices' data, only the test set and
each device's number of samples (``dataset_sizes``, public: it enters the record-level
accounting).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from aggregator.evaluate import subset_indices
from aggregator.outcome import channel_only_sentence, noiseless_devices
from radio.link import ChannelState
from testbed.core.calibration_status import cap_channel_state
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.link import link_name
from testbed.core.data.datasets import Dataset
from testbed.core.models import get_flat, n_params
from testbed.core.privacy.book import PrivacyBook
from testbed.core.process.blas_threads import limit_blas_threads
from testbed.core.record_schemes import RecordSettings, check_delta_bound
from testbed.core.run_setup import device_settings, initial_model
from testbed.core.runs.recovery import config_pin
from testbed.core.runs.rundir import RunDir
from testbed.core.schemes import DeviceUplink
from testbed.core.seeding import Stream, experiment_generator
from testbed.core.upload_events import PrivacyEvent, channel_fields, upload_event


class PaperAccountingWarning(UserWarning):
    """The budget is enforced with 003's own accounting, which is not a DP bound."""


class ChannelOnlyNoiseWarning(UserWarning):
    """Some devices add no noise of their own (``sigma`` 0, e.g. under a plan): their
    guarantee rests on the channel's noise alone
    (:func:`aggregator.outcome.channel_only_sentence`)."""


class RunState:
    """What the aggregator holds of one run.

    Parameters
    ----------
    cfg, hw
        The experiment and hardware configs.
    rundir
        The (locked) run directory.
    test_data
        The data set whose test part the global model is evaluated on, ``x_test``
        ``(n, *input_shape)``.
    dataset_sizes
        Every device's number of training samples (its shard as partitioned).

    Attributes
    ----------
    model, w, d
        The model (its weights are set from ``w`` to evaluate), the global weights
        ``(d,)`` float64 and their number.
    unit
        ``"record"`` or ``"device"`` for a DP scheme, ``None`` without DP.
    uplinks, record
        Every device's uplink settings; record-level settings (``[]`` at the device unit).
    book
        The privacy book (ledger and accountants); ``None`` without DP.
    eval_threads
        Threads of the evaluations, each evaluating its own batches on one intra-op thread
        (:func:`aggregator.evaluate.sample_scores`: the same results as one thread):
        ``torch_threads``, and the cores of the training workers too while a round's training
        runs in worker processes, which are idle while the global model is evaluated
        (:func:`aggregator.round_close.evaluations`).
    eval_index
        The fixed evaluation subset (test-set indices, ``(k,)``) or ``None``.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        hw: HardwareConfig,
        rundir: RunDir,
        test_data: Dataset,
        dataset_sizes: list[int],
    ) -> None:
        self.cfg = cfg
        self.hw = hw
        self.rundir = rundir
        torch.set_num_threads(cfg.torch_threads)
        limit_blas_threads(cfg.torch_threads)
        self.eval_threads = cfg.torch_threads
        self.data = test_data
        self.model = initial_model(cfg, self.data.x_test.shape[1:],
                                   n_classes=self.data.n_classes)
        self.d = n_params(self.model)
        self.unit = None if cfg.scheme == "fedavg" else cfg.privacy.unit
        #: ``{}``, or the summary's note on a delta >= 1/min D_i allowed by the config
        self.delta_bound = check_delta_bound(cfg, dataset_sizes)  # refuses it otherwise
        uplinks, record = device_settings(cfg, hw, self.d, dataset_sizes)
        self.uplinks: list[DeviceUplink] = uplinks
        self.record: list[RecordSettings] = [r for r in record if r is not None]
        silent = (noiseless_devices([up.sigma for up in uplinks], record) if self.unit
                  else [])
        if silent:
            warnings.warn(
                channel_only_sentence(silent, len(uplinks), unit=self.unit,
                                      credited=max(up.trusted for up in uplinks)),
                ChannelOnlyNoiseWarning,
                stacklevel=2,
            )
        self.run_secret = (rundir.path / "run_secret").read_text().strip()
        self.eval_index: np.ndarray | None = None
        if cfg.eval_subset is not None:
            self.eval_index = subset_indices(
                len(self.data.y_test), cfg.eval_subset,
                experiment_generator(cfg.seed, Stream.EVAL),
            )
            if len(self.eval_index) == len(self.data.y_test):
                self.x_sub, self.y_sub = self.data.x_test, self.data.y_test
            else:
                self.x_sub = self.data.x_test[self.eval_index]
                self.y_sub = self.data.y_test[self.eval_index]
        self.book: PrivacyBook | None = None
        if self.unit is not None:
            if self.unit == "device" and cfg.privacy.accounting == "paper":
                warnings.warn(
                    "privacy.accounting=paper enforces the budget with 003's Theorem 1, which "
                    "is not a DP bound (docs/privacy.md); the strict epsilon is reported next "
                    "to it",
                    PaperAccountingWarning,
                    stacklevel=3,
                )
            self.book = PrivacyBook(
                rundir.ledger_path,
                delta=cfg.privacy.delta,
                enforce=cfg.privacy.enforced,
                target=cfg.privacy.epsilon,
                unit=self.unit,
                relation=cfg.privacy.relation,
                header=config_pin(cfg, hw),  # resume with an edited config is refused
            )
        self.w = get_flat(self.model)

    def record_settings(self, i: int) -> RecordSettings | None:
        """Device ``i``'s record-level settings (``None`` at the device unit)."""
        return self.record[i] if self.record else None

    def event(self, i: int, t: int, state: ChannelState | None) -> PrivacyEvent:
        """The privacy event of device ``i``'s upload in round ``t`` given a channel state
        (``None``: unknown channel or a lost upload, no channel credit); see
        :func:`testbed.core.upload_events.upload_event`."""
        up = self.uplinks[i]
        # never credit more channel noise than the receiver's calibrated N0 lower bound
        state = cap_channel_state(state, self.hw, link_name(self.cfg, self.hw))
        return upload_event(self.cfg, up, self.record_settings(i), i, t,
                            channel_fields(state, up, self.d))
