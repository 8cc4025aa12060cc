"""What the ``aircomp`` scheme needs from the rest of an experiment config."""

from __future__ import annotations

from typing import Any

#: Links aircomp runs on in this version (the waveform, GNU Radio and radio links carry one
#: device per slot so far).
AIRCOMP_LINKS = ("symbol",)


#: Why the lab processes refuse aircomp in this version (``testbed aggregator``, ``launch``).
LAB_REFUSAL = ("config key 'scheme': got 'aircomp'; over-the-air aggregation runs in one process "
               "in this version (testbed run, the symbol link): the lab aggregator and its edges "
               "(testbed aggregator, edge, launch) send one device per slot so far")


def check_aircomp(cfg: Any) -> None:
    """Refuse an aircomp config that the scheme cannot run as asked, naming the key.

    Over-the-air aggregation here is FedSGD at the record unit with the noise on the upload:
    every device's share of the noise must be on the one value that goes on air, where the
    others' shares and the receiver's noise add to it (docs/privacy.md section 12).

    Raises
    ------
    ValueError
        Naming the key, its value and what is allowed.
    """
    pc = cfg.privacy
    if cfg.scheme != "aircomp":
        if pc.colluding_devices:
            raise ValueError(f"privacy.colluding_devices: got {pc.colluding_devices}; only for "
                             f"scheme aircomp (scheme is {cfg.scheme!r})")
        return
    wants = [("privacy.unit", pc.unit, "record"), ("privacy.noise", pc.noise, "upload"),
             ("privacy.noise_distribution", pc.noise_distribution, "gaussian"),
             ("local_steps", cfg.local_steps, 1)]
    for key, value, allowed in wants:
        if value != allowed:
            raise ValueError(
                f"{key}: got {value!r}; scheme aircomp needs {allowed!r} (FedSGD at the record "
                "unit with each device's share of the noise on the one value that goes on air)")
    if cfg.link is not None and cfg.link not in AIRCOMP_LINKS:
        raise ValueError(f"link: got {cfg.link!r}; scheme aircomp runs on {AIRCOMP_LINKS} in "
                         "this version")
    if pc.colluding_devices > cfg.devices - 1:
        raise ValueError(f"privacy.colluding_devices: got {pc.colluding_devices}; at most "
                         f"devices - 1 = {cfg.devices - 1}")
