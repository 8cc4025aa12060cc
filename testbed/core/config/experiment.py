"""Typed, validated experiment configuration.

An experiment config is a YAML mapping parsed into :class:`ExperimentConfig`. Unknown
keys, wrong types and out-of-range values are refused before anything runs; see
:mod:`testbed.core.config.loader` for the error format.

Units are in the key names or the field docs: ``snr_db`` in dB, ``p_max_w`` in watts,
``e_comp_j`` in joules.

Types are strict: an integer key takes an integer (not ``true``, not ``"5"``), a number
key takes an integer or a decimal (``privacy.epsilon: 5`` is fine) but not a boolean or a
string, and every number must be finite (``.inf`` and ``.nan`` are refused). Values that
would overflow later arithmetic have upper bounds: ``clip.bound <= 1e6``,
``privacy.sigma <= 1e6``, ``power.alpha <= 1e9``, ``power.p_max_w <= 100`` W,
``energy.e_comp_j <= 1e6`` J. ``name`` becomes a directory name under ``runs/``, so it must
be a plain file name (:data:`NAME_PATTERN`).

The sections of the config (``clip``, ``compression``, ``privacy``, ``power``, ``energy``,
``compute``) are in :mod:`testbed.core.config.sections`; ``compute`` (where the model
computes) is resolved on each host by :mod:`testbed.core.compute`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from testbed.core.config.aircomp_checks import check_aircomp
from testbed.core.config.link import LinkName
from testbed.core.config.safe_yaml import short_repr
from testbed.core.config.sections import (
    DEVICE_ALLOWED,
    DEVICE_PATTERN,
    ClipConfig,
    CompressionConfig,
    ComputeConfig,
    EnergyConfig,
    PowerConfig,
    PrivacyConfig,
    StrictModel,
    int_or_auto,
)
from testbed.core.extensions import absolute_paths, check_import_syntax, is_import_string
from testbed.core.scheme_api import check_scheme_class, split_scheme_import

__all__ = ["DEVICE_ALLOWED", "DEVICE_PATTERN", "ComputeConfig", "ExperimentConfig"]

SCHEMES = (
    "fedavg",
    "ldp-fedavg",
    "s-dp-fl",
    "channel-dp",
    "ee-dp-fl",
    "noise-after-compression",
    "dp-pasgd",
    "fedsgd-dpc",
    "zcdp-secagg",
    "aircomp",
)
#: Peer schemes that sample devices per round (``clients_per_round``: 004's b, 002's r).
SAMPLED_SCHEMES = ("fedsgd-dpc", "zcdp-secagg")
#: The peer systems (record unit, per-step noise only).
PEER_SCHEMES = ("dp-pasgd", *SAMPLED_SCHEMES)
DATASETS = ("fashion-mnist", "mnist", "cifar10")
MODELS = ("mnist-cnn", "cifar-cnn", "logreg")

#: Where each data set is looked for when ``data_dir`` is not given.
DEFAULT_DATA_DIRS: dict[str, str | None] = {
    "fashion-mnist": "/usr/share/datasets/fashion-mnist",
    "mnist": None,
    "cifar10": None,
}


#: A run name: letters, digits, ``-``, ``_``, ``.``; not starting with ``.``; 1-100 chars.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


class ExperimentConfig(StrictModel):
    """One experiment: what to train, over which link, with which privacy scheme."""

    name: str = Field(
        "default", description="run name, a plain file name (the run directory's prefix)"
    )
    seed: int = Field(
        0, ge=0, le=2**63 - 1, description="root seed for data, model init and channel"
    )
    rounds: int = Field(40, ge=1, le=1_000_000, description="global rounds K (uploads)")
    devices: int = Field(10, ge=1, le=100_000)
    local_steps: int = Field(20, ge=1, le=1_000_000, description="H, local SGD steps per round")
    batch_size: int = Field(32, ge=1, le=1_000_000)
    lr: float = Field(0.05, gt=0, le=100)
    dataset: str = Field(
        "fashion-mnist",
        description=(
            "fashion-mnist | mnist | cifar10, or an import string 'package.module:loader' "
            "(a lab's own data, docs/extensions.md)"
        ),
    )
    data_dir: str | None = Field(None, description="directory with the data set files")
    partition: Literal["iid", "noniid", "files"] = Field("noniid", description=(
        "files: device i's data is <data_dir>/device-<i> (docs/extensions.md)"))
    dominant_fraction: float = Field(
        0.75, gt=0, le=1, description="non-IID: fraction of a device's samples from its label"
    )
    model: str = Field(
        "mnist-cnn",
        description=(
            "mnist-cnn | cifar-cnn | logreg, or an import string 'package.module:factory' "
            "(a lab's own model, docs/extensions.md)"
        ),
    )
    extensions_path: list[str] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "directories put first on sys.path before the model and dataset import strings "
            "are imported; relative ones are taken from the current directory and stored "
            "absolute (docs/extensions.md)"
        ),
    )
    scheme: Literal[
        "fedavg", "ldp-fedavg", "s-dp-fl", "channel-dp", "ee-dp-fl", "noise-after-compression",
        "dp-pasgd", "fedsgd-dpc", "zcdp-secagg", "aircomp",
    ] = Field("fedavg", description="built-in, or 'package.module:Class' (docs/extensions.md)")
    scheme_class: str | None = Field(None, description="set from scheme: package.module:Class")
    clients_per_round: int | None = Field(
        None, ge=1, le=100_000,
        description=(
            "fedsgd-dpc (004): b devices per round, round robin; zcdp-secagg (002): r devices "
            "per round, drawn with the OS CSPRNG; null = every device"
        ),
    )
    link: LinkName | None = Field(
        None, description="overrides the hardware config's link"
    )
    hw_config: str = Field(
        "sim", min_length=1, description="name in hw_configs/ or a path to a YAML file"
    )
    snr_db: float | list[float] = Field(
        20.0, description="per-device average receive SNR (dB) at unit symbol power"
    )
    fading: Literal["none", "rayleigh", "rician"] = "none"
    rician_k_db: float = Field(6.0, ge=-30, le=60)
    noiseless: bool = Field(False, description="h = 1 and no channel noise (testing)")
    eval_every: int = Field(
        20,
        ge=1,
        le=1_000_000,
        description=(
            "rounds between evaluations on the full test set (test_accuracy, test_loss); the "
            "last round is always evaluated on it"
        ),
    )
    progress_every: int = Field(
        1,
        ge=1,
        le=1_000_000,
        exclude=True,
        description=(
            "rounds between the plain progress lines a run prints on stderr when stderr is "
            "not a terminal (the last round always prints; a terminal gets a progress bar, "
            "--no-progress neither). Output only: not written to config.yaml nor pinned, so "
            "a resumed run prints every round"
        ),
    )
    eval_samples: int | None = Field(
        None, ge=1, le=10**9, description="cap on test samples (the 'full test set')"
    )
    eval_subset: int | None = Field(
        500,
        ge=1,
        le=10**9,
        description=(
            "test samples evaluated every round (subset_accuracy, subset_loss): a fixed "
            "subset of the (capped) test set drawn without replacement from the experiment "
            "seed (stream EVAL), the same in every round and after a resume; the whole test "
            "set when it has fewer samples; null = no per-round subset evaluation. 500 "
            "samples: standard error about 1.8 points at 80 % accuracy, for 3 % of a default "
            "round"
        ),
    )
    workers: int | Literal["auto"] = Field(
        1,
        description=(
            "processes that train the devices of a round in parallel: an integer 1-256 or "
            "'auto' (the cores this process may run on, os.sched_getaffinity, divided by "
            "torch_threads; 1 while a power meter measures computing energy). 1 = train in "
            "the run's own process, one device after another. Results are the same for the "
            "same seed; encoding, transmission and the privacy ledger stay in the run's "
            "process, in device order"
        ),
    )
    sample_devices: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description=(
            "devices asked to upload per round, drawn uniformly without replacement from the "
            "population of `devices` (schemes other than fedsgd-dpc and zcdp-secagg, which "
            "take clients_per_round). Drawn from the experiment seed (stream "
            "DEVICE_SAMPLING): reproducible and the same after a resume, and public to "
            "whoever knows the seed, so no privacy amplification by device sampling is "
            "credited: each device's epsilon composes its own uploads only. Device state is "
            "created when a device is first selected; the round is averaged over the "
            "selected devices. null = every device, every round"
        ),
    )
    train_samples: int | None = Field(
        None, ge=1, le=10**9, description="cap on training samples used"
    )
    plan: str | None = Field(None, description="plan YAML from `testbed plan` (ee-dp-fl)")
    aircomp_plan: str | None = Field(
        None, description="scheme aircomp: plan YAML from `testbed plan --scheme aircomp` "
        "(the noise share and the common amplitude c)")
    record: bool = Field(False, description="store received I/Q as SigMF")
    project_decoded: bool = Field(
        True,
        description=(
            "with clip.mode coordinate, clip each decoded coordinate to the range the sent "
            "value could have without noise, (d/l) Z / sqrt(d) (post-processing: no privacy "
            "cost); off = plain channel inversion of 003 eq. 14"
        ),
    )
    torch_threads: int = Field(
        1,
        ge=1,
        le=256,
        description=(
            "intra-op threads for training, per worker process (1 avoids oversubscription)"
        ),
    )
    loss_targets: list[float] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "training losses whose first round and energy spent up to it (all devices, "
            "computing + radio) the summary reports (003 Fig. 3)"
        ),
    )
    loss_target_window: int = Field(
        5,
        ge=1,
        le=1_000_000,
        description=(
            "rounds in the trailing mean of the training loss that loss_targets and "
            "stop_at_loss compare with the target (1 = the raw per-round loss); the same "
            "definition as `testbed calibrate --window`"
        ),
    )
    stop_at_loss: float | None = Field(
        None,
        gt=0,
        description=(
            "end the run (status completed) after the first round whose training loss, "
            "averaged over loss_target_window rounds, is at or below this; null = run all "
            "rounds"
        ),
    )
    clip: ClipConfig = ClipConfig()
    compression: CompressionConfig = CompressionConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    power: PowerConfig = PowerConfig()
    energy: EnergyConfig = EnergyConfig()
    compute: ComputeConfig = ComputeConfig()

    @model_validator(mode="before")
    @classmethod
    def _scheme_by_import_string(cls, data: Any) -> Any:
        return split_scheme_import(data)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise ValueError(
                "allowed: a plain file name of 1-100 letters, digits, '-', '_' or '.', "
                "not starting with '.' (it names the run directory under runs/)"
            )
        return v

    @field_validator("dataset", "model", mode="before")
    @classmethod
    def _builtin_or_import_string(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str):
            key = "dataset" if info.field_name == "dataset" else "model"
            check_import_syntax(key, v, DATASETS if key == "dataset" else MODELS)
        return v

    @field_validator("extensions_path")
    @classmethod
    def _absolute_paths(cls, v: list[str]) -> list[str]:
        return absolute_paths(v)

    @field_validator("snr_db", mode="before")
    @classmethod
    def _snr_values(cls, v: Any) -> Any:
        # Checked here, before the float | list union, so that one error names the
        # problem instead of one error per union member.
        values = v if isinstance(v, list) else [v]
        if isinstance(v, list) and not v:
            raise ValueError("allowed: a number or a non-empty list of numbers (dB)")
        for x in values:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise ValueError(
                    f"SNR {short_repr(x, 80)} is not a number; allowed: a number or a list of "
                    "numbers (dB)"
                )
            if not math.isfinite(x) or not -50.0 <= x <= 100.0:
                raise ValueError(f"SNR {x} dB outside the allowed range [-50, 100] dB")
        return v

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_value(cls, v: Any) -> Any:
        return int_or_auto(
            v, 256, "an integer 1-256 (worker processes) or 'auto' (the cores available)")

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        if isinstance(self.snr_db, list) and len(self.snr_db) != self.devices:
            raise ValueError(
                f"snr_db: a list must have one value per device ({self.devices}), "
                f"got {len(self.snr_db)}"
            )
        private = self.scheme != "fedavg"
        if self.clients_per_round is not None:
            if self.scheme not in SAMPLED_SCHEMES:
                raise ValueError(
                    f"clients_per_round: got {self.clients_per_round}; only for schemes "
                    f"{SAMPLED_SCHEMES} (scheme is {self.scheme!r})"
                )
            if self.clients_per_round > self.devices:
                raise ValueError(
                    f"clients_per_round: got {self.clients_per_round}; at most devices "
                    f"({self.devices})"
                )
        if self.sample_devices is not None:
            if self.scheme in SAMPLED_SCHEMES:
                raise ValueError(
                    f"sample_devices: got {self.sample_devices}; scheme {self.scheme!r} picks "
                    "its devices per round itself (its paper's rule): use clients_per_round"
                )
            if self.sample_devices > self.devices:
                raise ValueError(
                    f"sample_devices: got {self.sample_devices}; at most devices "
                    f"({self.devices}), the population it is drawn from"
                )
        if self.workers != 1 and self.energy.source == "measured":
            raise ValueError(
                f"workers: got {self.workers!r} with energy.source 'measured': a power meter "
                "measures the whole host over each device's training slice, and parallel "
                "slices overlap (the energy would be counted twice); allowed: workers=1, or "
                "energy.source=model"
            )
        if self.scheme == "zcdp-secagg" and (self.clients_per_round or self.devices) < 3:
            raise ValueError(
                "clients_per_round: secure aggregation (zcdp-secagg) needs at least 3 devices "
                f"per round, got {self.clients_per_round or self.devices}"
            )
        if self.scheme in ("dp-pasgd", *SAMPLED_SCHEMES) and (
            self.privacy.unit != "record" or self.privacy.noise != "per-step"
        ):
            raise ValueError(
                f"scheme: {self.scheme!r} adds noise at every local step of every record's "
                f"clipped gradient; it needs privacy.unit=record and privacy.noise=per-step "
                f"(got {self.privacy.unit!r} and {self.privacy.noise!r})"
            )
        if self.privacy.noise_distribution == "laplace" and self.scheme != "fedsgd-dpc":
            raise ValueError(
                f"privacy.noise_distribution: 'laplace' is 004's mechanism and runs only with "
                f"scheme 'fedsgd-dpc' (scheme is {self.scheme!r}); use "
                "privacy.noise_distribution=gaussian"
            )
        if self.scheme == "fedsgd-dpc" and self.local_steps != 1:
            raise ValueError(
                f"local_steps: got {self.local_steps}; fedsgd-dpc (004) replies with one local "
                "step per round (FedSGD): set local_steps=1"
            )
        if self.scheme == "dp-pasgd" and (
            self.privacy.unit != "record" or self.privacy.noise != "per-step"
        ):
            raise ValueError(
                f"scheme: 'dp-pasgd' (000) adds noise at every local step of every record's "
                f"clipped gradient; it needs privacy.unit=record and privacy.noise=per-step "
                f"(got {self.privacy.unit!r} and {self.privacy.noise!r})"
            )
        if private and self.privacy.unit == "record":
            if self.scheme == "noise-after-compression":
                raise ValueError(
                    "privacy.unit: 'record' is not available with scheme "
                    "'noise-after-compression' (its noise sits on the quantized vector, whose "
                    "record-level sensitivity is not C/B); use privacy.unit=device"
                )
            if self.privacy.sigma is not None:
                raise ValueError(
                    f"privacy.sigma: got {self.privacy.sigma}; with privacy.unit=record the "
                    "noise is set by privacy.noise_multiplier (z, per step), not sigma"
                )
            if self.plan is not None and (
                self.privacy.noise != "upload" or self.privacy.noise_multiplier is not None
            ):
                raise ValueError(
                    "plan: a record-level plan sets the upload noise itself; it needs "
                    "privacy.noise=upload and privacy.noise_multiplier=null"
                )
            if self.privacy.noise == "upload" and self.local_steps != 1:
                raise ValueError(
                    f"privacy.noise: 'upload' with local_steps={self.local_steps}: with noise "
                    "only at the upload, later local steps depend on a record through the "
                    "weights, so the record-level sensitivity is not C/B; set local_steps=1 "
                    "(FedSGD) or privacy.noise=per-step"
                )
        check_scheme_class(self)
        check_aircomp(self)
        if self.partition == "files" and (self.data_dir is None or self.train_samples):
            raise ValueError("partition: 'files' reads <data_dir>/device-<i>: set data_dir, and "
                             "leave train_samples unset (each directory is a device's shard)")
        if self.privacy.unit == "device" and self.privacy.noise_multiplier is not None:
            raise ValueError(
                "privacy.noise_multiplier: only for privacy.unit=record; the device unit takes "
                "privacy.sigma"
            )
        if private and self.privacy.unit == "device" and self.clip.mode == "none":
            raise ValueError(
                f"clip.mode: 'none' is not allowed with scheme '{self.scheme}' "
                "(DP needs bounded sensitivity); use 'coordinate' or 'norm'"
            )
        # a data set by import string: its sample shape is checked when the model is built
        if (self.model == "cifar-cnn" and self.dataset != "cifar10"
                and not is_import_string(self.dataset)):
            raise ValueError("model: 'cifar-cnn' needs dataset 'cifar10'")
        if self.model == "mnist-cnn" and self.dataset == "cifar10":
            raise ValueError("model: 'mnist-cnn' takes 28x28x1 images; use 'cifar-cnn'")
        return self

    def n0_confidence(self) -> float:
        """Two-sided confidence of estimated channel bounds (``privacy.n0_confidence``, or
        ``1 - delta / (20 rounds)``: each upload's two bounds fail with probability at most
        ``2 (1 - c)``, so over ``rounds`` uploads at most ``delta / 10``; scheme aircomp:
        ``1 - delta / (10 (devices + 1) rounds)``, since a round's events rest on one
        interval per participant and the receiver's ``N0`` bound)."""
        if self.privacy.n0_confidence is not None:
            return self.privacy.n0_confidence
        if self.scheme == "aircomp":
            return 1.0 - self.privacy.delta / (10.0 * (self.devices + 1) * self.rounds)
        return 1.0 - self.privacy.delta / (20.0 * self.rounds)

    def snr_db_per_device(self) -> list[float]:
        """Per-device SNR in dB, shape ``(devices,)``."""
        if isinstance(self.snr_db, list):
            return list(self.snr_db)
        return [float(self.snr_db)] * self.devices

    def resolved_data_dir(self) -> str | None:
        """The data directory: the configured one, else the data set's default."""
        if self.data_dir is not None:
            return self.data_dir
        return DEFAULT_DATA_DIRS.get(self.dataset)  # None for an import string
