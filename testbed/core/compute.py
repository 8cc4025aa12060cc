"""Where the model computes: the ``compute.device`` setting resolved to a torch device.

Local training, per-example gradients and test-set evaluation run on the resolved device;
everything that leaves them as numpy (flat weight vectors, differentials, uploads) comes
back to the CPU, and privacy noise is drawn on the CPU as always (OS CSPRNG). The setting
is resolved once per process, before any work (``testbed run`` before the run directory
exists, an edge agent at set-up), and the resolved device is passed down explicitly.

``cpu`` computes exactly as before the setting existed (bit for bit). On CUDA the results
differ from the CPU's in the last bits (other kernels, other summation orders) and need not
repeat from run to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from testbed.core.config.errors import ConfigError
from testbed.core.config.sections import DEVICE_ALLOWED, DEVICE_PATTERN

__all__ = ["ResolvedDevice", "check_workers", "cuda_report", "resolve_device"]


@dataclass(frozen=True)
class ResolvedDevice:
    """The device a process computes on.

    Attributes
    ----------
    setting
        The configured ``compute.device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``).
    torch_device
        The torch device: ``cpu``, or ``cuda:N`` with its index.
    reason
        Why this device, in one sentence (``auto``'s choice, or the setting asked for it).
    """

    setting: str
    torch_device: torch.device
    reason: str

    @property
    def name(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return str(self.torch_device)

    def metadata(self) -> dict[str, Any]:
        """What ``meta.json`` records: the setting, the device, why, torch's version and
        whether torch saw CUDA."""
        return {
            "setting": self.setting,
            "device": self.name,
            "reason": self.reason,
            "torch": torch.__version__,
            "cuda_available": bool(torch.cuda.is_available()),
        }


def cuda_report() -> str:
    """What torch reports about CUDA, for messages: availability, device count, build."""
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    built = torch.version.cuda
    build = f"built with CUDA {built}" if built else "a CPU-only build, no CUDA support"
    return (
        f"torch {torch.__version__} ({build}) reports torch.cuda.is_available() = "
        f"{available}, {count} CUDA device{'s' if count != 1 else ''}"
    )


def resolve_device(setting: str) -> ResolvedDevice:
    """Resolve ``compute.device`` on this host.

    Parameters
    ----------
    setting
        ``auto`` (the first CUDA device when ``torch.cuda.is_available()``, else the CPU),
        ``cpu``, ``cuda`` (the first CUDA device) or ``cuda:N``.

    Returns
    -------
    ResolvedDevice

    Raises
    ------
    ConfigError
        A value outside those, or a CUDA device that torch does not see here (no CUDA, or
        ``N`` at or past the device count); the message names ``compute.device``, the value,
        what torch reports and the alternatives.
    """
    if not isinstance(setting, str) or not DEVICE_PATTERN.fullmatch(setting):
        raise ConfigError(
            f"config key 'compute.device': got {setting!r}; allowed: {DEVICE_ALLOWED}"
        )
    if setting == "cpu":
        return ResolvedDevice(setting, torch.device("cpu"), "compute.device is 'cpu'")
    available = torch.cuda.is_available()
    if setting == "auto":
        if not available:
            return ResolvedDevice(
                setting, torch.device("cpu"),
                "auto: no CUDA device (torch.cuda.is_available() is False), using the CPU",
            )
        return ResolvedDevice(
            setting, torch.device("cuda", 0),
            f"auto: CUDA is available ({torch.cuda.device_count()} device(s)), using cuda:0 "
            f"({torch.cuda.get_device_name(0)})",
        )
    index = 0 if setting == "cuda" else int(setting.split(":", 1)[1])
    count = torch.cuda.device_count() if available else 0
    if not available or index >= count:
        why = "no CUDA device is usable" if not available else (
            f"there is no CUDA device {index} (indices 0..{count - 1})")
        raise ConfigError(
            f"config key 'compute.device': got {setting!r}, but {why}: {cuda_report()}; "
            "allowed here: 'auto' (uses CUDA when there is a GPU, else the CPU) or 'cpu'"
            + (f", or 'cuda:N' with N < {count}" if count else "")
        )
    return ResolvedDevice(
        setting, torch.device("cuda", index),
        f"compute.device is {setting!r}: cuda:{index} ({torch.cuda.get_device_name(index)})",
    )


def check_workers(device: torch.device, workers: int | str) -> None:
    """Refuse training worker processes on a GPU (before any work).

    The worker processes of ``workers`` are forked from the run's process
    (:mod:`testbed.parallel_training`), and a forked process cannot use CUDA. On a GPU the
    devices of a round are trained one after another in the run's process: ``workers:
    auto`` then means 1, an explicit number above 1 is refused.

    Raises
    ------
    ConfigError
        ``device`` is a CUDA device and ``workers`` an integer above 1.
    """
    if device.type == "cuda" and not isinstance(workers, str) and workers > 1:
        raise ConfigError(
            f"config key 'workers': got {workers}; local training is on {device} "
            "(compute.device), and forked worker processes cannot use CUDA; allowed: 1 or "
            "'auto' (1 on a GPU), or compute.device=cpu"
        )
