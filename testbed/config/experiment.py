"""Typed, validated experiment configuration.

An experiment config is a YAML mapping parsed into :class:`ExperimentConfig`. Unknown
keys, wrong types and out-of-range values are refused before anything runs; see
:mod:`testbed.config.loader` for the error format.

Units are in the key names or the field docs: ``snr_db`` in dB, ``p_max_w`` in watts,
``e_comp_j`` in joules.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMES = (
    "fedavg",
    "ldp-fedavg",
    "s-dp-fl",
    "channel-dp",
    "ee-dp-fl",
    "noise-after-compression",
)
LINKS = ("symbol", "waveform", "gnuradio", "usrp")
DATASETS = ("fashion-mnist", "mnist", "cifar10")
MODELS = ("mnist-cnn", "cifar-cnn", "logreg")

#: Where each data set is looked for when ``data_dir`` is not given.
DEFAULT_DATA_DIRS: dict[str, str | None] = {
    "fashion-mnist": "/usr/share/datasets/fashion-mnist",
    "mnist": None,
    "cifar10": None,
}


class _Strict(BaseModel):
    """Base: unknown keys are errors, values are not silently coerced across kinds."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, validate_default=True)


class ClipConfig(_Strict):
    """Clipping of the local differential before any noise (SEED-NOTES item 1).

    ``mode: coordinate`` clips every coordinate to ``|g_j| <= bound / sqrt(d)`` (the paper's
    per-coordinate clipping, which implies ``||g||_2 <= bound``); ``mode: norm`` rescales
    ``g`` so that ``||g||_2 <= bound``; ``mode: none`` disables clipping (no DP scheme
    accepts it). ``bound`` is therefore always the l2 bound ``Z`` of 003 Section IV-C.
    """

    mode: Literal["coordinate", "norm", "none"] = "coordinate"
    bound: float = Field(5.0, gt=0, description="Z, l2 bound of the clipped differential")


class CompressionConfig(_Strict):
    """C_{q,s} of 003 eq. (8): random sparsification then stochastic quantization."""

    sparsify: bool = True
    theta_s: float = Field(0.1, gt=0, le=1, description="l/d, fraction of coordinates kept")
    quantize: bool = True
    levels: int = Field(16, ge=1, le=1 << 20, description="Q, quantization levels")


class PrivacyConfig(_Strict):
    """Privacy targets and artificial noise."""

    epsilon: float = Field(5.0, gt=0, description="per-device target epsilon")
    delta: float = Field(1e-5, gt=0, lt=1)
    accounting: Literal["paper", "strict"] = Field(
        "strict", description="accounting that enforces the budget; both are reported"
    )
    sigma: float | None = Field(
        None,
        ge=0,
        description=(
            "artificial noise std per coordinate; null = the smallest value meeting epsilon "
            "over all rounds (calibrated per device)"
        ),
    )
    trusted_channel_noise: float = Field(
        1.0, ge=0, le=1, description="fraction of channel noise credited (0 = local DP)"
    )
    n0_confidence: float = Field(
        0.95, gt=0, lt=1, description="confidence of the N0 lower bound when N0 is estimated"
    )


class PowerConfig(_Strict):
    """Transmit scaling."""

    alpha: float | None = Field(
        None, gt=0, description="power scaling alpha_i; null = normalise to unit symbol power"
    )
    p_max_w: float = Field(0.1, gt=0, description="per-device maximum transmit power (W)")


class EnergyConfig(_Strict):
    """Computing energy model (003 Section V-A)."""

    e_comp_j: float = Field(0.5, ge=0, description="local computing energy per round (J)")


class ExperimentConfig(_Strict):
    """One experiment: what to train, over which link, with which privacy scheme."""

    name: str = "default"
    seed: int = Field(0, ge=0, description="root seed for data, model init and channel")
    rounds: int = Field(40, ge=1, le=1_000_000, description="global rounds K (uploads)")
    devices: int = Field(10, ge=1, le=100_000)
    local_steps: int = Field(20, ge=1, description="H, local SGD steps per round")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0, le=100)
    dataset: Literal["fashion-mnist", "mnist", "cifar10"] = "fashion-mnist"
    data_dir: str | None = Field(None, description="directory with the data set files")
    partition: Literal["iid", "noniid"] = "noniid"
    dominant_fraction: float = Field(
        0.75, gt=0, le=1, description="non-IID: fraction of a device's samples from its label"
    )
    model: Literal["mnist-cnn", "cifar-cnn", "logreg"] = "mnist-cnn"
    scheme: Literal[
        "fedavg", "ldp-fedavg", "s-dp-fl", "channel-dp", "ee-dp-fl", "noise-after-compression"
    ] = "fedavg"
    link: Literal["symbol", "waveform", "gnuradio", "usrp"] | None = Field(
        None, description="overrides the hardware config's link"
    )
    hw_config: str = Field("sim", description="name in hw_configs/ or a path to a YAML file")
    snr_db: float | list[float] = Field(
        20.0, description="per-device average receive SNR (dB) at unit symbol power"
    )
    fading: Literal["none", "rayleigh", "rician"] = "none"
    rician_k_db: float = Field(6.0, ge=-30, le=60)
    noiseless: bool = Field(False, description="h = 1 and no channel noise (testing)")
    eval_every: int = Field(1, ge=1)
    eval_samples: int | None = Field(None, ge=1, description="cap on test samples evaluated")
    train_samples: int | None = Field(None, ge=1, description="cap on training samples used")
    plan: str | None = Field(None, description="plan YAML from `testbed plan` (ee-dp-fl)")
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
        1, ge=1, le=256, description="intra-op threads for training (1 avoids oversubscription)"
    )
    clip: ClipConfig = ClipConfig()
    compression: CompressionConfig = CompressionConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    power: PowerConfig = PowerConfig()
    energy: EnergyConfig = EnergyConfig()

    @field_validator("snr_db")
    @classmethod
    def _snr_range(cls, v: float | list[float]) -> float | list[float]:
        values = v if isinstance(v, list) else [v]
        for x in values:
            if not -50.0 <= x <= 100.0:
                raise ValueError(f"SNR {x} dB outside the allowed range [-50, 100] dB")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        if isinstance(self.snr_db, list) and len(self.snr_db) != self.devices:
            raise ValueError(
                f"snr_db: a list must have one value per device ({self.devices}), "
                f"got {len(self.snr_db)}"
            )
        if self.scheme != "fedavg" and self.clip.mode == "none":
            raise ValueError(
                f"clip.mode: 'none' is not allowed with scheme '{self.scheme}' "
                "(DP needs bounded sensitivity); use 'coordinate' or 'norm'"
            )
        if self.model == "cifar-cnn" and self.dataset != "cifar10":
            raise ValueError("model: 'cifar-cnn' needs dataset 'cifar10'")
        if self.model == "mnist-cnn" and self.dataset == "cifar10":
            raise ValueError("model: 'mnist-cnn' takes 28x28x1 images; use 'cifar-cnn'")
        return self

    def snr_db_per_device(self) -> list[float]:
        """Per-device SNR in dB, shape ``(devices,)``."""
        if isinstance(self.snr_db, list):
            return list(self.snr_db)
        return [float(self.snr_db)] * self.devices

    def resolved_data_dir(self) -> str | None:
        """The data directory: the configured one, else the data set's default."""
        return self.data_dir if self.data_dir is not None else DEFAULT_DATA_DIRS[self.dataset]
