"""Which channel noise a run credits as privacy noise: one rule, applied before calibration.

**The rule.** A run credits the fraction ``tau = privacy.trusted_channel_noise`` of the
channel noise at the aggregator's receiver only when

1. its scheme credits channel noise (``SCHEMES[scheme].credit_channel``) and ``tau > 0``,
2. and the link's noise is secret (:attr:`radio.link.Link.noise_is_secret`): physical
   receiver noise (``usrp``), or simulated noise drawn from the OS CSPRNG
   (:class:`CsprngChannelNoise`, given to the ``symbol`` and ``waveform`` links of such a
   run; ``flowgraphs/csprng_noise.py`` in the ``gnuradio`` emulator of such a run; the
   virtual air's thermal noise on virtual USRPs).

Otherwise the run credits 0, for the whole run: :func:`credited_config` is the config every
device's settings are resolved from (:func:`testbed.core.run_setup.device_settings`, on the
aggregator and on every edge), so the artificial noise is calibrated to meet the target with
no channel noise, every upload's event carries ``trusted_channel_noise = 0``, and the
summary says why (:func:`channel_noise_report`). Seeded noise, which anyone holding the run
directory can regenerate (the channel generator spawned from ``seed``; GNU Radio's fast
noise table seeded by ``noise_seed``, used only by runs that credit nothing), is never
credited.

A run that credits nothing keeps the seeded noise: it stays bit-reproducible from its seed.
The record unit adds its own conditions on top (no credit through a quantizer or with noise
at every local step; :mod:`testbed.core.record_schemes`), and the device unit's strict
accounting credits nothing through a quantizer after the noise. A config whose scheme asks
for the credit but whose uploads cannot carry it gets a :class:`ChannelCreditWarning` saying
why and what to set instead (:func:`credit_blocked`), and the summary's reason says the same.

**When the credit is known.** On the ``symbol`` link the channel state is known before the
upload leaves (``probe``), so the artificial noise is calibrated *with* the credit at the
configured SNR and the budget gate checks the credit it will get. On the links whose
receiver estimates ``N0`` from the frame's pilots (:data:`ESTIMATED_LINKS`: ``waveform``,
``gnuradio``, ``usrp``, virtual or real), the credited noise (a lower confidence bound
from the received frame) exists only after reception, and the gate before transmission
can count none. Calibrating with a credit the gate cannot see would refuse every upload
(``budget_exhausted`` at round 0). So on those links the artificial noise is calibrated
**without** the credit (:func:`calibration_config`: it alone meets the target), and each
upload's event still carries the trusted fraction: the channel noise measured in the
received frame is credited **after the fact**, and the epsilon spent comes out below the
target (the summary reports it with and without the credit). A plan that assumed the credit
is refused on those links.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from radio.channel_noise import SEEDED, ChannelNoise
from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.link import link_name
from testbed.core.noise import gaussian
from testbed.core.schemes import SCHEMES, quant_levels

if TYPE_CHECKING:
    from testbed.core.schemes import DeviceUplink

#: Complex samples per CSPRNG draw (bounds the float64 scratch to ~4 MB).
_CHUNK = 1 << 17


class CsprngChannelNoise(ChannelNoise):
    """Simulated receiver noise from the OS CSPRNG (:func:`testbed.core.noise.gaussian`).

    The same sampler as the devices' privacy noise: ``os.urandom`` uniforms through
    Box-Muller; real and imaginary parts independent ``N(0, N0 / 2)``. It takes no seed and
    ignores the channel generator it is passed, so nothing in a run directory regenerates it.
    """

    secret = True
    origin = (
        "simulated, drawn from the OS CSPRNG like the privacy noise, never from the "
        "experiment seed"
    )

    def complex_normal(self, n: int, noise_var: float, rng: np.random.Generator) -> np.ndarray:
        z = gaussian((int(n), 2), math.sqrt(noise_var / 2.0))
        return z[:, 0] + 1j * z[:, 1]

    def fill(self, out: np.ndarray, noise_var: float, rng: np.random.Generator) -> None:
        for c0 in range(0, out.size, _CHUNK):
            m = min(_CHUNK, out.size - c0)
            out[c0 : c0 + m] = self.complex_normal(m, noise_var, rng)


#: The secret source of the simulated links (stateless).
CSPRNG_NOISE = CsprngChannelNoise()


@dataclass(frozen=True)
class LinkNoise:
    """Where a run's link takes its additive noise from.

    Attributes
    ----------
    secret
        ``True``: it cannot be regenerated from the run directory (may be credited).
    origin
        In words, for ``meta.json`` and the summary.
    """

    secret: bool
    origin: str


def wants_channel_credit(cfg: ExperimentConfig) -> bool:
    """The config asks for channel noise to be credited (scheme and ``tau > 0``), whatever
    the link."""
    return (
        cfg.scheme != "fedavg"
        and SCHEMES[cfg.scheme].credit_channel
        and cfg.privacy.trusted_channel_noise > 0
    )


class ChannelCreditWarning(UserWarning):
    """The scheme asks for the channel-noise credit, but the config's uploads cannot carry it
    (noise at every local step, or a quantizer after the noise): nothing is credited."""


def credit_blocked(cfg: ExperimentConfig) -> str:
    """Why a config whose scheme asks for the channel credit gets none from the form of its
    uploads, with what to set instead; ``""`` when it can (or does not ask).

    The conditions are those the uplinks are resolved with
    (:func:`testbed.core.record_schemes.resolve_record_uplinks`: upload noise and no
    quantizer; :mod:`testbed.core.privacy.analysis.strict`: no quantizer between the noise and the
    air). A plan decides its own credit (checked when it is loaded), so a config with a plan
    gives ``""``.

    Parameters
    ----------
    cfg
        The experiment config.

    Returns
    -------
    str
        One sentence for a warning and the summary, or ``""``.
    """
    if not wants_channel_credit(cfg) or cfg.plan is not None:
        return ""
    pc, levels = cfg.privacy, quant_levels(cfg)
    asks = (f"scheme {cfg.scheme} credits the channel noise (privacy.trusted_channel_noise "
            f"{pc.trusted_channel_noise:g}), but")
    if pc.unit == "record" and pc.noise == "per-step":
        return (
            f"{asks} privacy.noise=per-step adds the privacy noise at each of the "
            f"{cfg.local_steps} local steps, and the channel noise reaches the model only "
            "through the upload, not linearly, so nothing is credited and the artificial "
            "noise alone meets the target; for the credit set privacy.noise=upload and "
            "local_steps=1 (FedSGD, as testbed/config/private-fedsgd.yaml)"
        )
    quantized = levels is not None and (
        pc.unit == "record"
        or (SCHEMES[cfg.scheme].noise == "before" and pc.accounting == "strict")
    )
    if quantized:
        return (
            f"{asks} its quantizer (Q = {levels}) sits between the privacy noise and the air "
            "and is not linear, so nothing is credited and the artificial noise alone meets "
            "the target; for the credit set compression.quantize=false"
            + (" (or scheme noise-after-compression, whose fixed-scale quantizer comes "
               "before the noise)" if pc.unit == "device" else "")
        )
    return ""


def noise_source(cfg: ExperimentConfig) -> ChannelNoise:
    """The noise source of a simulated link (``symbol``, ``waveform``): the OS CSPRNG when
    the run wants channel credit, else the seeded channel generator (reproducible)."""
    return CSPRNG_NOISE if wants_channel_credit(cfg) else SEEDED


#: Links whose receiver learns the channel (``N0``, gain) only from the received frame.
ESTIMATED_LINKS = ("waveform", "gnuradio", "usrp")


def link_noise(cfg: ExperimentConfig, hw: HardwareConfig) -> LinkNoise:
    """The noise of the link :func:`testbed.core.links.make_link` builds for ``cfg`` on ``hw``
    (``make_link`` checks that the link's :attr:`~radio.link.Link.noise_is_secret` agrees)."""
    name = link_name(cfg, hw)
    if name == "usrp" and hw.virtual:
        return LinkNoise(
            True,
            "thermal noise of the virtual air (testbed air), every sample drawn fresh from "
            "the OS CSPRNG like the privacy noise, never from a seed",
        )
    if name == "usrp":
        return LinkNoise(True, "physical receiver noise of the USRP")
    if name == "gnuradio" and wants_channel_credit(cfg):
        return LinkNoise(
            True,
            "GNU Radio channel emulator with csprng_noise_adder: every sample drawn fresh "
            "from the OS CSPRNG like the privacy noise (channel_model's own noise off)",
        )
    if name == "gnuradio":
        return LinkNoise(
            False,
            "GNU Radio channels.channel_model's fast noise source: a table pre-drawn from "
            f"gnuradio.noise_seed={hw.gnuradio.noise_seed} and replayed, regenerable from "
            "the run directory",
        )
    src = noise_source(cfg)
    return LinkNoise(src.secret, src.origin)


@dataclass(frozen=True)
class ChannelCredit:
    """The channel credit a run's config and link allow.

    Attributes
    ----------
    fraction
        ``tau`` credited (0: none).
    noise
        The link's noise.
    reason
        Why nothing is credited; ``""`` when ``fraction > 0``.
    """

    fraction: float
    noise: LinkNoise
    reason: str


def channel_credit(cfg: ExperimentConfig, hw: HardwareConfig) -> ChannelCredit:
    """Apply the rule of this module to a run's configs."""
    noise = link_noise(cfg, hw)
    tau = cfg.privacy.trusted_channel_noise
    if cfg.scheme == "fedavg":
        return ChannelCredit(0.0, noise, "scheme fedavg is not differentially private")
    if not SCHEMES[cfg.scheme].credit_channel:
        return ChannelCredit(0.0, noise, f"scheme {cfg.scheme} does not credit it")
    if tau <= 0:
        return ChannelCredit(0.0, noise, "privacy.trusted_channel_noise is 0")
    if not noise.secret:
        return ChannelCredit(
            0.0,
            noise,
            f"the {link_name(cfg, hw)} link's noise is seeded ({noise.origin}), and seeded "
            "noise is never credited",
        )
    return ChannelCredit(float(tau), noise, "")


def credited_config(cfg: ExperimentConfig, hw: HardwareConfig) -> ExperimentConfig:
    """``cfg`` with ``privacy.trusted_channel_noise`` set to what the run may credit: the
    config every device's settings (sigma, alpha, the trusted fraction) are resolved from.

    Warns
    -----
    ChannelCreditWarning
        The scheme asks for the credit but the uploads cannot carry it
        (:func:`credit_blocked`).

    Raises
    ------
    ConfigError
        A plan that credits channel noise, over a link whose noise is seeded (the plan's
        sigma assumed a credit the run cannot give).
    """
    blocked = credit_blocked(cfg)
    if blocked:
        warnings.warn(blocked, ChannelCreditWarning, stacklevel=2)
    return _credited_config(cfg, hw)


def _credited_config(cfg: ExperimentConfig, hw: HardwareConfig) -> ExperimentConfig:
    """:func:`credited_config` without its warning."""
    credit = channel_credit(cfg, hw)
    if credit.fraction == cfg.privacy.trusted_channel_noise or not wants_channel_credit(cfg):
        return cfg
    if cfg.plan is not None:
        raise ConfigError(
            f"config key 'plan': plan '{cfg.plan}' credits channel noise, but {credit.reason}; "
            "re-plan with --set privacy.trusted_channel_noise=0, or use a link whose noise "
            "is secret (symbol, waveform, usrp)"
        )
    privacy = cfg.privacy.model_copy(update={"trusted_channel_noise": credit.fraction})
    return cfg.model_copy(update={"privacy": privacy})


def credited_after_reception(cfg: ExperimentConfig, hw: HardwareConfig) -> bool:
    """Whether the run credits channel noise measured only after reception (a credit on
    one of :data:`ESTIMATED_LINKS`; the module docstring)."""
    return channel_credit(cfg, hw).fraction > 0 and link_name(cfg, hw) in ESTIMATED_LINKS


def calibration_config(cfg: ExperimentConfig, hw: HardwareConfig) -> ExperimentConfig:
    """The config the artificial noise is calibrated from: :func:`credited_config`, and on
    a link that credits only after reception, no credit (``trusted_channel_noise = 0``).

    Raises
    ------
    ConfigError
        As :func:`credited_config`; or a plan that credits channel noise on a link that
        learns it only after reception (its sigma leaned on a credit the budget gate cannot
        count before the upload leaves).
    """
    cfg = _credited_config(cfg, hw)
    if not credited_after_reception(cfg, hw):
        return cfg
    if cfg.plan is not None:
        raise ConfigError(
            f"config key 'plan': plan '{cfg.plan}' calibrated its noise with a channel credit, "
            f"but the {link_name(cfg, hw)} link learns the channel noise only from the "
            "received frame, so the budget gate before transmission cannot count it; re-plan "
            "with --set privacy.trusted_channel_noise=0 (the run still credits the measured "
            "noise after reception), or use the symbol link"
        )
    privacy = cfg.privacy.model_copy(update={"trusted_channel_noise": 0.0})
    return cfg.model_copy(update={"privacy": privacy})


def channel_noise_report(
    cfg: ExperimentConfig, hw: HardwareConfig, uplinks: Sequence[DeviceUplink]
) -> dict[str, Any]:
    """The summary's ``privacy.channel_noise``: the link's noise, the credited fraction
    (largest over devices) and, when it is 0, why."""
    credit = channel_credit(cfg, hw)
    credited = max((up.trusted for up in uplinks), default=0.0)
    reason = credit.reason
    if credited == 0 and not reason:
        reason = credit_blocked(cfg) or (
            "the scheme's uploads do not put the channel noise on the noisy value linearly "
            "(a quantizer in between, or noise at every local step; docs/privacy.md)"
        )
    return {
        "source": credit.noise.origin,
        "secret": credit.noise.secret,
        "credited_fraction": float(credited),
        "reason": reason if credited == 0 else "",
    }


def channel_noise_source(cfg: ExperimentConfig, hw: HardwareConfig) -> str:
    """``meta.json``'s ``channel_noise_source``: the link's noise and whether it is credited."""
    credit = channel_credit(cfg, hw)
    if credit.fraction > 0:
        return f"{credit.noise.origin}; credited (fraction {credit.fraction:g})"
    return f"{credit.noise.origin}; not credited: {credit.reason}"
