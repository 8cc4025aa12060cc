"""The privacy event of one upload: one function for the in-process run, the aggregator
and the edge agent, so that both ledgers of a lab run record the same event."""

from __future__ import annotations

from typing import Any

import numpy as np

from radio.link import ChannelState
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.privacy import LaplaceRecordEvent, RecordEvent, UploadEvent
from testbed.core.privacy.aircomp_events import AirCompEvent
from testbed.core.privacy.event_types import PrivacyEvent  # re-exported: any upload's event
from testbed.core.record_schemes import RecordSettings, step_sigma
from testbed.core.schemes import DeviceUplink


def channel_fields(state: ChannelState | None, up: DeviceUplink, d: int) -> dict[str, Any]:
    """The channel part of an upload's event, from the state the receiver credits.

    The credited fraction is ``up.trusted``, which :mod:`testbed.core.channel_credit` has already
    set to 0 where the scheme credits no channel noise or the link's noise is seeded (not
    secret): that rule is the only gate. ``state=None`` (unknown channel, or a lost upload)
    credits no channel noise either. An estimated
    state is credited through its confidence bounds, whose failure probability the event
    carries (``bound_failure_prob``: the ``n0`` lower and ``|h|`` upper bounds each fail with
    probability at most ``1 - confidence``).

    Returns
    -------
    dict
        ``alpha``, ``gain`` (credited |h|), ``n0`` (per real dimension), the
        ``trusted_channel_noise`` fraction, ``d``, ``l`` and ``bound_failure_prob``.
    """
    seen = state if up.trusted > 0 else None  # the state credited, if any
    return {
        "alpha": float(up.alpha or 0.0),
        "gain": float(np.sqrt(seen.credited_gain_power())) if seen else 0.0,
        "n0": seen.noise_var_lower / 2.0 if seen else 0.0,
        "trusted_channel_noise": up.trusted if seen else 0.0,
        "d": d,
        "l": up.l,
        "bound_failure_prob": (
            min(1.0, 2.0 * (1.0 - seen.confidence)) if seen and seen.estimated else 0.0
        ),
    }


#: Keys of :func:`channel_fields` that a peer may send (the rest each side knows itself).
CHANNEL_KEYS = ("gain", "n0", "trusted_channel_noise", "bound_failure_prob")
#: The part of an over-the-air aggregation event (``record-aircomp/v1``) that the receiver
#: measures or the round decides (the paths' bounds, the others' credited noise, the
#: receiver's): the aggregator sends it; the device builds the rest from its own settings.
AIRCOMP_CHANNEL_KEYS = ("gain_ratio_upper", "others_noise_std", "receiver_noise_var",
                        "bound_failure_prob")


def channel_keys(scheme: str) -> tuple[str, ...]:
    """The channel fields an event of ``scheme`` takes from the aggregator."""
    return AIRCOMP_CHANNEL_KEYS if scheme == "aircomp" else CHANNEL_KEYS


def event_channel(event: PrivacyEvent) -> dict[str, Any] | None:
    """The channel part of ``event`` (``None``: an event with none, e.g. 004's Laplace
    replies)."""
    data = event.to_dict()
    for keys in (CHANNEL_KEYS, AIRCOMP_CHANNEL_KEYS):
        if all(k in data for k in keys):
            return {k: data[k] for k in keys}
    return None


def upload_event(
    cfg: ExperimentConfig,
    up: DeviceUplink,
    record: RecordSettings | None,
    device: int,
    round_index: int,
    channel: dict[str, Any],
) -> PrivacyEvent:
    """Device ``device``'s privacy event for round ``round_index``.

    A Laplace reply (``record.noise_distribution == "laplace"``) gives a
    :class:`~testbed.core.privacy.LaplaceRecordEvent`, which credits no channel noise.

    Parameters
    ----------
    cfg
        The run's config (clip mode and bound of device-level events).
    up, record
        The device's uplink and, at the record unit, record-level settings (``None`` at the
        device unit).
    channel
        :func:`channel_fields` of the credited state.
    """
    if cfg.scheme == "aircomp":
        return _aircomp_event(cfg, up, record, device, round_index, channel)
    if record is not None and record.noise_distribution == "laplace":
        return LaplaceRecordEvent(
            round=round_index,
            device=device,
            scale=record.laplace_scale,
            example_clip=record.example_clip,
            dataset_size=record.dataset_size,
            relation=record.relation,
        )
    if record is not None:
        rs = record
        per_step = rs.noise == "per-step"
        if per_step or not rs.credit_channel:
            channel = channel | {
                "gain": 0.0, "n0": 0.0, "trusted_channel_noise": 0.0, "bound_failure_prob": 0.0
            }
        return RecordEvent(
            round=round_index,
            device=device,
            steps=rs.steps,
            sampling_rate=rs.sampling_rate,
            amplified=rs.amplified,
            example_clip=rs.example_clip,
            expected_batch=rs.expected_batch,
            dataset_size=rs.dataset_size,
            sigma=step_sigma(rs) if per_step else up.sigma,
            relation=rs.relation,
            **channel,
        )
    return UploadEvent(
        round=round_index,
        device=device,
        mechanism=up.mechanism,
        sigma=up.sigma,
        q=up.levels,
        clip=cfg.clip.bound,
        clip_mode=cfg.clip.mode,
        quantizer_scale=up.quantizer_scale,
        **channel,
    )


def _aircomp_event(cfg: ExperimentConfig, up: DeviceUplink, record: RecordSettings | None,
                   device: int, round_index: int, channel: dict[str, Any]) -> AirCompEvent:
    """The device's ``record-aircomp/v1`` event: its own settings, and the round's part
    (:data:`AIRCOMP_CHANNEL_KEYS`) from ``channel``; without it, its own noise only (no
    other device's, no receiver's credited): the conservative figure."""
    from testbed.core.config.aircomp_checks import aircomp_colluding

    if record is None:
        raise ValueError("scheme aircomp runs at the record unit")
    part = {k: channel[k] for k in AIRCOMP_CHANNEL_KEYS if k in channel}
    return AirCompEvent(
        round=round_index, device=device, sampling_rate=record.sampling_rate,
        amplified=record.amplified, example_clip=record.example_clip,
        expected_batch=record.expected_batch, dataset_size=record.dataset_size,
        sigma=up.sigma, colluding=aircomp_colluding(cfg), relation=record.relation,
        **part,
    )
