"""``usrp.emulated``: the record a hardware config carries once its radios were replaced by
virtual ones because UHD found none of them (``--fallback emulate``,
:mod:`testbed.core.radio_fallback`).

Only the fallback writes it. Every process that reads such a config (the aggregator, the
edges, ``testbed air``, a resumed run) therefore knows its radios are emulated, and the run's
``meta.json``, ``summary.json``, outcome line and report say so (:data:`EMULATED_LABEL`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: What every output says of a run on emulated radios.
EMULATED_LABEL = "emulated radios (no USRP found)"


def radios_words(radios: str) -> str:
    """A summary's ``radios`` in words, for the outcome line and the report: ``USRPs``,
    ``virtual radios``, or :data:`EMULATED_LABEL` as it is."""
    return {"usrp": "USRPs", "virtual": "virtual radios"}.get(radios, radios)


class EmulatedRadios(BaseModel):
    """Where the emulated radios came from.

    Attributes
    ----------
    hardware
        Name of the hardware config whose USRPs were not found.
    missing
        Each configured device that UHD was asked for, as ``key = 'args'``.
    uhd
        What UHD said (no device, or why it could not look).
    snr_db
        Mean ``Es/N0`` (dB) each transmitter's emulated path was set to, by serial.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    hardware: str = Field(min_length=1, max_length=256)
    missing: list[str] = Field(min_length=1, max_length=1100)
    uhd: str = Field(max_length=2000)
    snr_db: dict[str, float] = Field(default_factory=dict)
