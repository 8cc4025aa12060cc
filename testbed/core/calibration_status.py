"""How a run uses its hardware config's calibration, and what it says about it.

``testbed radio calibrate`` writes a :class:`~testbed.core.config.calibration.Calibration`
that the hardware config includes (``calibration: CAL.yaml``). A run on the ``usrp`` link:

* transmits with the measured ``tx_power_ref_w`` of each device where it was measured at the
  configured gain and amplitude (:func:`testbed.core.config.hardware.device_radio`);
* credits channel noise from a received frame only up to the receiver's measured N0 lower
  bound at the run's receive gain (:func:`cap_channel_state`): the pilots' own lower bound
  is kept where it is lower, so the credit never exceeds either bound (a minimum of two
  lower bounds fails no more often than each alone);
* takes the calibration's deadline as the train allowance unless ``--train-allowance`` is
  given (:func:`train_allowance`), and its guard as the least TDMA guard of a lab round
  (:func:`aggregator.lab.usrp_split.round_guard_s`);
* says in its outcome line and report whether the calibration is missing, stale (older than
  ``calibration_max_age_days``) or current, and its age (:func:`calibration_status`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from radio.link import ChannelState
from testbed.core.config.errors import ConfigError
from testbed.core.config.hardware import HardwareConfig, device_radio, same_usrp


@dataclass(frozen=True)
class CalibrationStatus:
    """What a run says about its radios' calibration.

    Attributes
    ----------
    state
        ``current``, ``stale``, ``missing``, or ``not_needed`` (not the ``usrp`` link).
    age_days
        Days since it was measured (``None``: none).
    line
        One sentence for the report.
    short
        The outcome line's clause (empty when there is nothing to warn of).
    """

    state: str
    age_days: float | None
    line: str
    short: str = ""

    @property
    def warns(self) -> bool:
        """Whether the outcome line should carry it (missing or stale)."""
        return self.state in ("missing", "stale")


def calibration_status(hw: HardwareConfig, link: str, now: datetime | None = None
                       ) -> CalibrationStatus:
    """The calibration status of a run on ``link`` over ``hw`` (module docstring)."""
    if link != "usrp":
        return CalibrationStatus("not_needed", None,
                                 f"radio calibration: not needed on the {link} link")
    cal = hw.calibration
    if cal is None:
        return CalibrationStatus(
            "missing", None,
            f"radios not calibrated: hardware config '{hw.name}' has no calibration (run "
            "testbed radio calibrate and include its CAL.yaml); tx_power_ref_w is the "
            "configured one", "radios not calibrated")
    age = cal.age_days(now)
    when = cal.written_utc.isoformat(timespec="seconds")
    where = f" ({cal.source})" if cal.source else ""
    limit = hw.calibration_max_age_days
    if age > limit:
        return CalibrationStatus(
            "stale", age, f"radio calibration stale: measured {when}{where}, {age:.1f} days "
            f"ago, older than calibration_max_age_days = {limit:g}; re-run testbed radio "
            "calibrate", f"radio calibration stale ({age:.1f} days old, limit {limit:g})")
    return CalibrationStatus("current", age,
                             f"radio calibration: measured {when}{where}, {age:.1f} days ago")


def train_allowance(hw: HardwareConfig, given: float | None, default: float) -> float:
    """The lab round's train allowance (s): ``given`` (``--train-allowance``), else the
    calibration's deadline (the slowest edge's measured training time with a margin), else
    ``default``."""
    if given is not None:
        return float(given)
    cal = hw.calibration
    if cal is not None and cal.deadline_s is not None:
        return float(cal.deadline_s)
    return float(default)


def credited_n0_cap(hw: HardwareConfig) -> float | None:
    """The receiver's measured N0 lower bound per sample (receiver output units) at the
    configured ``usrp.rx_gain_db``; ``None``: no calibration, none at that gain, or one
    measured on another receiver (``usrp.rx_args``: e.g. the emulation fallback's)."""
    cal = hw.calibration
    if cal is None or cal.receiver is None or not same_usrp(cal.receiver.rx_args,
                                                            hw.usrp.rx_args):
        return None
    floor = cal.receiver.floor_at(hw.usrp.rx_gain_db)
    return None if floor is None else floor.n0_sample_lower


def cap_channel_state(state: ChannelState | None, hw: HardwareConfig, link: str
                      ) -> ChannelState | None:
    """``state`` with its credited N0 (``noise_var_lower``) capped at the calibration's
    lower bound (:func:`credited_n0_cap`) on the ``usrp`` link, whose frames are read in the
    receiver's own units; unchanged on other links, without a bound, or when the state was
    not estimated."""
    cap = credited_n0_cap(hw) if link == "usrp" else None
    if state is None or cap is None or not state.estimated or state.noise_var_lower <= cap:
        return state
    return replace(state, noise_var_lower=cap)


def calibration_summary(hw: HardwareConfig, link: str, now: datetime | None = None
                        ) -> dict[str, Any] | None:
    """The summary's ``radio_calibration`` (``None`` off the ``usrp`` link): the status
    (:func:`calibration_status`), and what the run took from the calibration: each device's
    ``tx_power_ref_w`` in force and whether it was measured, the N0 cap, guard, deadline and
    the problems the calibration found."""
    st = calibration_status(hw, link, now)
    if st.state == "not_needed":
        return None
    out: dict[str, Any] = {"state": st.state, "age_days": st.age_days, "line": st.line,
                           "short": st.short}
    cal = hw.calibration
    if cal is None:
        return out
    ids = [e.device for e in hw.usrp.devices] or [0]
    devices = []
    for i in ids:
        try:
            used = device_radio(hw, i).tx_power_ref_w
        except ConfigError:
            continue
        entry = cal.device(i)
        measured = entry.tx_power_ref_w if entry is not None else None
        devices.append({"device": i, "tx_power_ref_w": used,
                        "measured": measured is not None and abs(measured - used) < 1e-15})
    return out | {"measured_utc": cal.written_utc.isoformat(timespec="seconds"),
                  "source": cal.source, "devices": devices, "n0_cap": credited_n0_cap(hw),
                  "guard_s": cal.guard_s, "deadline_s": cal.deadline_s,
                  "problems": list(cal.problems)}
