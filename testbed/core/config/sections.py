"""The sections of the experiment config
(:class:`~testbed.core.config.experiment.ExperimentConfig`): clipping, compression, privacy,
transmit power, computing energy and where the model computes, each a strict pydantic
model on the common base ``StrictModel`` (the rules on types and ranges are in
:mod:`testbed.core.config.experiment`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StrictModel(BaseModel):
    """Base: unknown keys are errors, values are not coerced across kinds, floats finite.

    Strict mode refuses ``true`` or ``"5"`` for an integer and for a number, and an integer
    for a boolean; an integer is still accepted for a float (``epsilon: 5``).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, validate_default=True
    )


class ClipConfig(StrictModel):
    """Clipping of the local differential before any noise (SEED-NOTES item 1).

    ``mode: coordinate`` clips every coordinate to ``|g_j| <= bound / sqrt(d)`` (the paper's
    per-coordinate clipping, which implies ``||g||_2 <= bound``); ``mode: norm`` rescales
    ``g`` so that ``||g||_2 <= bound``; ``mode: none`` disables clipping (no DP scheme
    accepts it). ``bound`` is therefore always the l2 bound ``Z`` of 003 Section IV-C.
    """

    mode: Literal["coordinate", "norm", "none"] = "coordinate"
    bound: float = Field(
        5.0, gt=0, le=1e6, description="Z, l2 bound of the clipped differential"
    )


class CompressionConfig(StrictModel):
    """C_{q,s} of 003 eq. (8): random sparsification then stochastic quantization."""

    sparsify: bool = True
    theta_s: float = Field(0.1, gt=0, le=1, description="l/d, fraction of coordinates kept")
    quantize: bool = True
    levels: int = Field(16, ge=1, le=1 << 20, description="Q, quantization levels")


class PrivacyConfig(StrictModel):
    """Privacy targets and artificial noise."""

    epsilon: float = Field(5.0, gt=0, description="per-device target epsilon (finite)")
    delta: float = Field(
        1e-5,
        gt=0,
        lt=1,
        description=(
            "delta of (epsilon, delta)-DP; must be < 1/n, n = min D_i (record unit: the "
            "smallest device's records) or n = devices (device unit), unless "
            "allow_large_delta"
        ),
    )
    allow_large_delta: bool = Field(
        False,
        description=(
            "run although delta >= 1/n (see delta): the summary's privacy section then says "
            "so (delta_exceeds_1_over_D: true and a sentence); otherwise such a delta is "
            "refused before the first round"
        ),
    )
    accounting: Literal["paper", "strict"] = Field(
        "strict", description="accounting that enforces the budget; both are reported"
    )
    sigma: float | None = Field(
        None,
        ge=0,
        le=1e6,
        description=(
            "artificial noise std per coordinate; null = the smallest value meeting epsilon "
            "over all rounds (calibrated per device)"
        ),
    )
    trusted_channel_noise: float = Field(
        1.0, ge=0, le=1, description="fraction of channel noise credited (0 = local DP)"
    )
    colluding_devices: int = Field(
        0, ge=0, le=100_000, description=(
            "scheme aircomp: t, the other devices assumed to collude against a device (their "
            "noise is not credited to it; docs/privacy.md section 12)"))
    dropout_margin: int = Field(
        0, ge=0, le=100_000, description=(
            "scheme aircomp: m, the other devices that may fail to transmit after the budget "
            "gate (a refusal, a missed slot): the noise shares and the gate assume the m "
            "largest other shares absent too, so m failures never pass a target"))
    n0_confidence: float | None = Field(
        None,
        gt=0,
        lt=1,
        description=(
            "two-sided confidence of the N0 and |h| bounds when the channel is estimated; "
            "null = 1 - delta / (20 rounds), so the failure probabilities of the two bounds "
            "(added to delta in delta_total) sum to at most delta / 10 per device"
        ),
    )
    unit: Literal["record", "device"] = Field(
        "record",
        description=(
            "privacy unit: 'record' (one sample of a device's data, 003 Definition 1; "
            "per-example clipping, Poisson batches) or 'device' (a device's whole data set)"
        ),
    )
    noise: Literal["per-step", "upload"] = Field(
        "per-step",
        description=(
            "record unit: Gaussian noise on every local step's clipped sum (DP-SGD on the "
            "device) or once on the upload (needs local_steps 1; channel noise credited)"
        ),
    )
    noise_distribution: Literal["gaussian", "laplace"] = Field(
        "gaussian",
        description=(
            "record unit: 'gaussian' (Poisson batches, l2 clipping, Gaussian noise per step) "
            "or 'laplace' (scheme fedsgd-dpc only, 004's Laplace mechanism: every record in "
            "the one local step, l1 clipping to example_clip, sum / D_i, Laplace noise from "
            "the OS CSPRNG; pure DP)"
        ),
    )
    example_clip: float = Field(
        1.0,
        gt=0,
        le=1e6,
        description=(
            "record unit: l2 bound C of each example's gradient (l1 bound xi_1 with "
            "noise_distribution laplace)"
        ),
    )
    accountant: Literal["rdp", "pld"] = Field(
        "pld",
        description="record unit: dp-accounting accountant that enforces the budget (both kept)",
    )
    relation: Literal["add-remove", "replace-one"] = Field(
        "add-remove", description="record unit: neighbouring data sets"
    )
    secure_sampling: bool = Field(
        True,
        description=(
            "record unit: Poisson batches drawn from the OS CSPRNG, so subsampling "
            "amplification is credited (false: seeded batches, no amplification credited)"
        ),
    )
    noise_multiplier: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description=(
            "record unit: noise multiplier z per step (laplace: scale / (example_clip / D_i)); "
            "null = calibrated to epsilon"
        ),
    )
    per_example: Literal["auto", "vmap", "layers"] = Field(
        "auto",
        description=(
            "record unit: per-example gradients by the layer-wise formulas (ghost norms of "
            "linear layers, batched per-example convolution gradients; the same clipped sum "
            "as vmap, checked against it) where they cover every parameterised layer of the "
            "model ('auto', decided once per model; 'layers' refuses a model they do not "
            "cover), or by torch.func (vmap over grad, any model); edge_device/per_example.py"
        ),
    )
    stop_on_budget: bool = Field(
        False,
        description=(
            "a run that stops because no device has budget left, after at least one round, "
            "counts as a success (exit code 0)"
        ),
    )

    @property
    def enforced(self) -> str:
        """The accounting that enforces the budget: ``accountant`` for the record unit,
        ``accounting`` for the device unit."""
        return self.accountant if self.unit == "record" else self.accounting


class PowerConfig(StrictModel):
    """Transmit scaling."""

    alpha: float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="power scaling alpha_i; null = normalise to unit symbol power",
    )
    p_max_w: float = Field(
        0.1, gt=0, le=100, description="per-device maximum transmit power (W), at most 100 W"
    )


class EnergyConfig(StrictModel):
    """Computing energy: the model (003 Section V-A) or a power meter (``source``)."""

    e_comp_j: float = Field(
        0.5, ge=0, le=1e6, description="local computing energy per round (J), at most 1e6 J"
    )
    source: Literal["model", "measured", "auto"] = Field(
        "model",
        description=(
            "computing energy per device per round: 'model' = e_comp_j; 'measured' = a "
            "power meter (Jetson INA3221 or Intel RAPL; whole board/package over the "
            "device's training time slice), refused at start when none is available; "
            "'auto' = a power meter when available, else e_comp_j"
        ),
    )


def int_or_auto(v: Any, high: int, allowed: str) -> Any:
    """A key's ``int | 'auto'`` value checked before pydantic's union (one clear message
    instead of one error per member): ``'auto'``, or an integer in ``[1, high]``; else
    ``ValueError`` saying ``allowed``."""
    if isinstance(v, str) and v == "auto":
        return v
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= high:
        raise ValueError(f"allowed: {allowed}")
    return v


#: The values of ``compute.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (N >= 0).
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda|cuda:(0|[1-9][0-9]{0,3})")
#: What ``compute.device`` allows, for error messages.
DEVICE_ALLOWED = (
    "'auto' (CUDA when torch sees a GPU, else the CPU), 'cpu', 'cuda' or 'cuda:N' "
    "(N = 0, 1, ...: the GPU's index)"
)


class ComputeConfig(StrictModel):
    """Where local training, per-example gradients and evaluation compute.

    ``device: auto`` takes the first CUDA device when torch sees one, else the CPU; ``cpu``
    computes exactly as before this setting existed; ``cuda`` / ``cuda:N`` ask for a GPU
    and are refused before any work on a host where torch does not see it
    (:func:`testbed.core.compute.resolve_device`). Each host resolves it for itself (the
    aggregator for evaluation, every edge agent for its training).
    """

    device: str = Field(
        "auto",
        description=(
            "auto | cpu | cuda | cuda:N: where the model trains and is evaluated (auto: "
            "CUDA when available, else the CPU); privacy noise stays on the CPU"
        ),
    )

    batch_devices: int | Literal["auto"] = Field(
        "auto",
        description=(
            "testbed run (the devices simulated in the run's process): devices whose local "
            "training (plain minibatch SGD at the device unit) runs together, one "
            "torch.func.vmap pass over their stacked parameters per step "
            "(edge_device/batched_trainer.py). An integer 1-4096 or 'auto'. 1 = one device "
            "after another, the reference; K > 1: the same minibatches, loss and SGD in "
            "batched kernels, results equal to float32 rounding (bit for bit for logreg as "
            "tested), faster for small models (logreg at 1,000 devices: about 4x less "
            "training time), slower for convolutional ones. Needs workers 1 (or auto), "
            "privacy.unit device, energy.source model and a model without buffers or "
            "dropout. 'auto' = 250 at a time where that gives the same model bit for bit "
            "and pays for its set-up (the built-in logreg, on the CPU, torch_threads 1, "
            "workers 1, privacy.unit device, energy.source model, at least 2,000 device "
            "trainings in the run), else 1 (docs/compute.md)"
        ),
    )

    @field_validator("batch_devices", mode="before")
    @classmethod
    def _batch_devices_value(cls, v: Any) -> Any:
        return int_or_auto(
            v, 4096, "an integer 1-4096 (devices trained together) or 'auto' (250 at a time "
            "where the result is the same bit for bit and it pays, else 1)")

    @field_validator("device", mode="before")
    @classmethod
    def _device_value(cls, v: Any) -> Any:
        # Before strict str checking: one message that says what is allowed.
        if not isinstance(v, str) or not DEVICE_PATTERN.fullmatch(v):
            raise ValueError(f"allowed: {DEVICE_ALLOWED}")
        return v
