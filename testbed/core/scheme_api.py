"""The scheme interface: what a device sends, how the aggregator combines, what privacy event
each upload is. The built-in schemes implement it; a lab's own scheme subclasses
:class:`Scheme` and is named in the config by import string (``scheme: package.module:Class``,
docs/extensions.md "A lab's own scheme").

A scheme has three parts:

* ``base``: the built-in scheme whose **privacy mechanism** it uses, one of
  :data:`USER_BASES`: clipping, artificial noise, compression, power scaling, the channel
  credit and the privacy event of every upload (its ledger entry and accounting) are the
  base's, done by the testbed. A user scheme cannot change them, so the accountant never
  credits noise that a user's code might have removed.
* :meth:`Scheme.prepare` (device side): maps the device's local differential before the
  testbed clips, noises and compresses it. At the device unit the testbed's clip bounds
  what ``prepare`` returns, so any function of the device's data is allowed. At the record
  unit with ``privacy.noise: per-step`` the differential is already private (each local step
  was noised) and ``prepare`` is post-processing. At the record unit with
  ``privacy.noise: upload`` the sensitivity comes from per-example clipping, which an
  arbitrary ``prepare`` could break: a scheme that overrides ``prepare`` is refused there.
* :meth:`Scheme.combine` (aggregator side): maps the decoded differentials of a round to the
  one the global model steps along (``w <- w - lr * combine(...)``). It sees only what was
  received (noisy, private uploads), so any function is post-processing and costs no privacy.

``combine`` and ``prepare`` must be deterministic functions of their arguments (and of the
scheme's constructor, called without arguments): a resumed run, the aggregator and the
edges each make their own instance, and nothing of it is checkpointed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from testbed.core.extensions import ExtensionError, absolute_paths, is_import_string, resolve

if TYPE_CHECKING:
    from testbed.core.config.experiment import ExperimentConfig

#: The built-in schemes a user scheme may take its privacy mechanism from. Not
#: ``zcdp-secagg``: under secure aggregation the aggregator sees only the sum, so there is
#: nothing per device to combine.
USER_BASES = (
    "fedavg", "ldp-fedavg", "s-dp-fl", "channel-dp", "ee-dp-fl", "noise-after-compression",
    "dp-pasgd", "fedsgd-dpc",
)

#: The privacy event of each upload, by base scheme and unit (testbed.core.privacy).
PRIVACY_EVENTS: Mapping[str, str] = {
    "fedavg": "none (no privacy claimed)",
    "device": "UploadEvent: one Gaussian (or discrete Gaussian after compression) mechanism "
              "on the clipped differential, channel noise credited where the base does",
    "record": "RecordEvent: H Poisson-subsampled Gaussian steps (per-step noise) or one "
              "(upload noise); LaplaceRecordEvent for fedsgd-dpc with Laplace noise",
}


class Scheme:
    """A federated scheme: the built-ins and a lab's own (subclass it).

    Attributes
    ----------
    base
        The built-in scheme whose privacy mechanism (clip, noise, compression, power, channel
        credit, privacy event) every upload uses; one of :data:`USER_BASES` for a subclass.
    """

    base: str = "fedavg"

    @property
    def name(self) -> str:
        """The scheme's name as reports show it (the built-in name, or the class's)."""
        return type(self).__qualname__

    def privacy_event(self, unit: str) -> str:
        """What privacy event each upload is, at ``unit`` (``device`` or ``record``)."""
        return PRIVACY_EVENTS["fedavg" if self.base == "fedavg" else unit]

    def prepare(self, differential: np.ndarray, *, device: int, round_index: int) -> np.ndarray:
        """The device's differential before the testbed clips, noises and compresses it.

        Parameters
        ----------
        differential
            ``float64``, shape ``(d,)``: ``(w_global - w_local) / lr`` of the round's local
            steps (already noised per step at the record unit with per-step noise).
        device, round_index
            Which device and round.

        Returns
        -------
        numpy.ndarray
            Shape ``(d,)``, finite. The default returns ``differential`` unchanged.
        """
        return differential

    def combine(
        self, differentials: Sequence[np.ndarray], *, n_devices: int, round_index: int
    ) -> np.ndarray:
        """The direction the global model steps along: ``w <- w - lr * combine(...)``.

        Parameters
        ----------
        differentials
            The decoded differentials of the round, each ``float64`` ``(d,)``, one per
            device received (at least one; a round with none leaves the model as it is).
        n_devices
            What the built-in average divides by: the federation's N (003 eq. 14), the
            ``sample_devices`` asked, or the devices asked by the schemes that sample them.
        round_index
            The round.

        Returns
        -------
        numpy.ndarray
            Shape ``(d,)``, finite. The default is :func:`federation_mean`.
        """
        return federation_mean(differentials, n_devices)


def federation_mean(differentials: Sequence[np.ndarray], n_devices: int) -> np.ndarray:
    """``(1/N) sum_i g_i`` over the devices that uploaded, ``float64``, shape ``(d,)``.

    Devices that sat a round out contribute zero, and the sum is still divided by the
    number of devices ``N`` of the federation (003 eq. 14 averages over all N), so the
    step size does not grow when devices drop out.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    if not differentials:
        raise ValueError("no differential to average")
    total = np.zeros_like(np.asarray(differentials[0], dtype=np.float64))
    for g in differentials:
        total += np.asarray(g, dtype=np.float64)
    return total / n_devices


class BuiltinScheme(Scheme):
    """A built-in scheme: its own base, the identity ``prepare`` and the mean."""

    def __init__(self, name: str) -> None:
        self.base = name

    @property
    def name(self) -> str:
        return self.base


def overrides_prepare(cls: type[Scheme]) -> bool:
    """Whether ``cls`` changes the device side (its ``prepare`` is not the base class's)."""
    return cls.prepare is not Scheme.prepare


def load_scheme_class(spec: str, paths: Sequence[str] = ()) -> type[Scheme]:
    """The :class:`Scheme` subclass ``spec`` (``package.module:Class``) names, checked.

    Raises
    ------
    ExtensionError
        It does not import, is not a subclass of :class:`Scheme`, or declares a ``base``
        outside :data:`USER_BASES`.
    """
    cls = resolve("scheme", spec, paths)
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise ExtensionError(
            f"scheme: {spec!r} is a {type(cls).__name__}, not a subclass of "
            "testbed.core.scheme_api.Scheme (docs/extensions.md)"
        )
    if not isinstance(cls.base, str) or cls.base not in USER_BASES:
        raise ExtensionError(
            f"scheme: {spec!r} declares base {cls.base!r}; allowed: one of "
            f"{', '.join(USER_BASES)} (the built-in whose privacy mechanism it uses)"
        )
    return cls


def split_scheme_import(data: Any) -> Any:
    """Config pre-validation: ``scheme: package.module:Class`` becomes ``scheme: <its base>``
    plus ``scheme_class: package.module:Class`` (the class is imported, with
    ``extensions_path`` first, to read its base). A config with both keys (a run's stored
    config) is checked for agreement. Anything else is returned unchanged.

    Raises
    ------
    ValueError
        The class does not import or is not a scheme (the message names the key), or
        ``scheme`` disagrees with the class's base.
    """
    if not isinstance(data, dict):
        return data
    scheme, spec = data.get("scheme"), data.get("scheme_class")
    if isinstance(scheme, str) and is_import_string(scheme):
        if spec is not None and spec != scheme:
            raise ValueError(f"scheme: {scheme!r} and scheme_class: {spec!r} disagree; give one")
        spec = scheme
    if spec is None:
        return data
    if not isinstance(spec, str) or not is_import_string(spec):
        raise ValueError(f"scheme_class: got {spec!r}; allowed: 'package.module:Class'")
    raw = data.get("extensions_path") or []
    # as the field will store them (its own validator refuses what is not a path)
    cls = load_scheme_class(spec, absolute_paths([p for p in raw if isinstance(p, str) and p]))
    if isinstance(scheme, str) and not is_import_string(scheme) and scheme != cls.base:
        raise ValueError(
            f"scheme: {scheme!r} but scheme_class {spec!r} declares base {cls.base!r}; set "
            f"scheme to the class's import string (or scheme_class: null for the built-in)"
        )
    return {**data, "scheme": cls.base, "scheme_class": spec}


def check_scheme_class(cfg: ExperimentConfig) -> None:
    """Refuse a scheme class whose ``prepare`` could undo the record-level sensitivity
    (``privacy.unit: record`` with ``privacy.noise: upload``, a private base).

    Raises
    ------
    ValueError
        Naming ``scheme_class`` and what is allowed.
    """
    if cfg.scheme_class is None or cfg.scheme == "fedavg":
        return
    if cfg.privacy.unit != "record" or cfg.privacy.noise != "upload":
        return
    if overrides_prepare(load_scheme_class(cfg.scheme_class, cfg.extensions_path)):
        raise ValueError(
            f"scheme_class: {cfg.scheme_class!r} overrides prepare; at privacy.unit=record with "
            "privacy.noise=upload the sensitivity comes from per-example clipping, which "
            "prepare could undo; allowed there: a scheme that changes only combine (or use "
            "privacy.noise=per-step, or the device unit)"
        )


@functools.lru_cache(maxsize=32)
def _instance(scheme: str, spec: str | None, paths: tuple[str, ...]) -> Scheme:
    if spec is None:
        return BuiltinScheme(scheme)
    cls = load_scheme_class(spec, paths)
    try:
        return cls()
    except Exception as exc:  # noqa: BLE001 - the user's constructor
        raise ExtensionError(
            f"scheme: {spec!r}: its constructor raised {type(exc).__name__}: {exc} (called "
            "without arguments)"
        ) from exc


def scheme_of(cfg: ExperimentConfig) -> Scheme:
    """The run's scheme object: the built-in, or an instance of ``cfg.scheme_class``."""
    return _instance(cfg.scheme, cfg.scheme_class, tuple(cfg.extensions_path))


def checked(out: Any, d: int, where: str) -> np.ndarray:
    """A ``prepare`` / ``combine`` result as ``float64`` ``(d,)``, refused when it is not
    one or not finite (naming the method)."""
    arr = np.asarray(out, dtype=np.float64)
    if arr.shape != (d,):
        raise ExtensionError(f"scheme: {where} returned shape {arr.shape}; expected ({d},)")
    if not np.all(np.isfinite(arr)):
        raise ExtensionError(f"scheme: {where} returned a non-finite value")
    return arr
