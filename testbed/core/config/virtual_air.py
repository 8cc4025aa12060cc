"""The ``virtual_air`` section of a hardware config: the channel between virtual USRPs.

Used when the config's device args name virtual devices (``type=virtual,serial=NAME``;
:mod:`radio.virtual_device`). ``testbed air --hw CONFIG`` runs the air it describes
(docs/virtual_lab.md): every virtual transmitter's bursts meet on one sample timeline at
the config's sample rate, each through its own path (``paths``: attenuation or distance,
carrier offset, fractional delay, and the section's fading), plus the receiver's thermal
noise (``temperature_k``, ``noise_figure_db``) drawn from the OS CSPRNG.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from testbed.core.config.sections import StrictModel
from testbed.core.transport.endpoints import endpoint_problem

_SERIAL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class AirPath(StrictModel):
    """One transmitter's path to the receiver (found by the transmitter's ``serial``)."""

    serial: str = Field(description="the transmitter's serial= in its device args")
    attenuation_db: float | None = Field(
        None, ge=0, le=300, description="path loss (dB): cables, attenuators, an emulator"
    )
    distance_m: float | None = Field(
        None, gt=0, le=1e7, description="free-space distance (m), isotropic antennas"
    )
    cfo_hz: float = Field(0.0, ge=-1e5, le=1e5, description="carrier offset at the receiver (Hz)")
    delay_samples: float = Field(
        0.0, ge=0, le=1e4, description="propagation delay (samples, fractional allowed)"
    )

    @field_validator("serial")
    @classmethod
    def _serial(cls, v: str) -> str:
        if not _SERIAL.match(v):
            raise ValueError(f"got {v!r}; allowed: 1-64 letters, digits, '_' or '-'")
        return v

    @model_validator(mode="after")
    def _one_loss(self) -> AirPath:
        if (self.attenuation_db is None) == (self.distance_m is None):
            raise ValueError(f"path of serial {self.serial}: give exactly one of "
                             "attenuation_db and distance_m")
        return self


class VirtualAirSection(StrictModel):
    """The virtual air: addresses, receiver noise, fading, and one path per transmitter."""

    burst_address: str = Field(
        "tcp://127.0.0.1:5600", description="where the air takes bursts (it binds)"
    )
    stream_address: str = Field(
        "tcp://127.0.0.1:5601", description="where the air streams to the receiver (it binds)"
    )
    temperature_k: float = Field(290.0, gt=0, le=1e4, description="noise temperature (K)")
    noise_figure_db: float = Field(5.0, ge=0, le=40, description="receiver noise figure (dB)")
    render_delay_s: float = Field(
        0.1, gt=0, le=5, description="the air renders time t at host time t + this (s)"
    )
    chunk_s: float = Field(0.01, gt=0, le=0.5, description="samples per stream chunk (s)")
    fading: Literal["none", "rayleigh", "rician"] = "none"
    speed_kmh: float = Field(0.0, ge=0, le=1000, description="Doppler speed (km/h)")
    rician_k_db: float | None = Field(None, ge=-30, le=40, description="Rician K-factor (dB)")
    fading_seed: int | None = Field(
        None, ge=0, le=2**63 - 1,
        description="seed of the fading realisation (channel state, never credited); "
        "null: fresh from the OS",
    )
    paths: list[AirPath] = Field(default_factory=list, max_length=1024)

    @field_validator("burst_address", "stream_address")
    @classmethod
    def _address(cls, v: str) -> str:
        # the loader's message already shows the value: the problem alone, once
        problem = endpoint_problem(v, bind=False, tcp_only=True)
        if problem is not None:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> VirtualAirSection:
        if self.burst_address == self.stream_address:
            raise ValueError("virtual_air.stream_address: the same as burst_address; "
                             "allowed: two different addresses")
        if self.fading == "rician" and self.rician_k_db is None:
            raise ValueError("virtual_air.rician_k_db: null with fading rician; allowed: "
                             "a K-factor in dB")
        if self.fading != "none" and not self.speed_kmh > 0:
            raise ValueError(f"virtual_air.speed_kmh: got {self.speed_kmh} with fading "
                             f"{self.fading}; allowed: > 0 (the Doppler sets how fast it fades)")
        seen: set[str] = set()
        for i, p in enumerate(self.paths):
            if p.serial in seen:
                raise ValueError(f"virtual_air.paths[{i}].serial: {p.serial} listed twice")
            seen.add(p.serial)
        return self

    def path(self, serial: str) -> AirPath | None:
        """The path of the transmitter ``serial`` (``None``: not listed)."""
        return next((p for p in self.paths if p.serial == serial), None)
