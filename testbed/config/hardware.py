"""Typed, validated hardware configuration (``hw_configs/*.yaml``).

A hardware config says which link carries the uploads and how the radio is set up. The
same experiment config runs over any of them; only the link changes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class HardwareConfig(_Strict):
    """Link selection and the radio parameters every link shares."""

    name: str = "sim"
    link: Literal["symbol", "waveform", "gnuradio", "usrp"] = "symbol"
    symbol_rate_hz: float = Field(
        200e3, gt=0, description="analog symbol rate; t_cm = 1 / symbol_rate_hz (s)"
    )
    tx_power_ref_w: float = Field(
        0.1, gt=0, description="radiated power (W) of a unit-average-power symbol stream"
    )
    coherence_symbols: int | None = Field(
        None, ge=1, description="block-fading length in symbols; null = one block per upload"
    )
