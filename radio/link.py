"""The link interface: the seam between the learning system and the radio.

Every link (``symbol``, ``waveform``, ``gnuradio``, ``usrp``) takes one device's analog
symbols and returns what the receiver got plus the channel state the receiver knows.
The learning side never sees anything else of the radio.

Conventions
-----------
* Symbols are complex baseband, ``complex128``, shape ``(n_symbols,)``. Two real values
  travel per symbol (:mod:`radio.analog`).
* Power is in *symbol-power units*: a stream with ``mean(|x|^2) == 1`` radiates the
  hardware config's ``tx_power_ref_w`` watts.
* ``noise_var`` is ``N0 = E|n|^2`` per complex symbol in the same units, so each real
  coordinate (I or Q) carries noise of variance ``N0 / 2``.
* The configured ``snr_db`` of a device is the receive SNR of a unit-power stream at
  unit average channel power gain: ``N0 = 10 ** (-snr_db / 10)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

import numpy as np


@dataclass(frozen=True)
class ChannelState:
    """What the receiver knows of the channel of one upload.

    Attributes
    ----------
    gain
        ``complex128``, shape ``(n_symbols,)``: the complex gain ``h`` of each payload
        symbol as the receiver knows it (realized in simulation, estimated from pilots
        over a waveform or radio link). Constant within a coherence block.
    noise_var
        Point value of ``N0`` per complex symbol (symbol-power units).
    noise_var_lower, noise_var_upper
        Confidence bounds on ``N0``. Equal to ``noise_var`` when N0 is known exactly (the
        simulated links); the privacy accountant only ever credits ``noise_var_lower``.
    estimated
        ``True`` when ``gain`` and ``noise_var`` were estimated from the received signal.
    confidence
        Two-sided confidence level of ``[noise_var_lower, noise_var_upper]``.
    gain_power_upper
        Upper confidence bound on ``max |h|^2`` over the upload when the gain is estimated
        (a larger gain means less privacy from the channel); ``None`` when exact.
    """

    gain: np.ndarray
    noise_var: float
    noise_var_lower: float
    noise_var_upper: float
    estimated: bool = False
    confidence: float = 1.0
    gain_power_upper: float | None = None

    def __post_init__(self) -> None:
        if self.gain.ndim != 1 or not np.iscomplexobj(self.gain):
            raise ValueError("ChannelState.gain must be a 1-d complex array")
        if not (0.0 <= self.noise_var_lower <= self.noise_var <= self.noise_var_upper):
            raise ValueError(
                "ChannelState: need 0 <= noise_var_lower <= noise_var <= noise_var_upper, got "
                f"{self.noise_var_lower}, {self.noise_var}, {self.noise_var_upper}"
            )

    @classmethod
    def known(cls, gain: np.ndarray, noise_var: float) -> ChannelState:
        """State known exactly (simulation): both bounds equal the true N0."""
        return cls(
            gain=np.asarray(gain, dtype=np.complex128),
            noise_var=float(noise_var),
            noise_var_lower=float(noise_var),
            noise_var_upper=float(noise_var),
            estimated=False,
            confidence=1.0,
        )

    def max_gain_power(self) -> float:
        """``max |h|^2`` over the upload (the least private block)."""
        return float(np.max(np.abs(self.gain) ** 2)) if self.gain.size else 0.0

    def credited_gain_power(self) -> float:
        """``|h|^2`` to use for privacy: the upper bound when estimated, else the max."""
        exact = self.max_gain_power()
        return exact if self.gain_power_upper is None else max(exact, self.gain_power_upper)

    def mean_gain_power(self) -> float:
        """``mean |h|^2`` over the upload."""
        return float(np.mean(np.abs(self.gain) ** 2)) if self.gain.size else 0.0


@dataclass(frozen=True)
class Reception:
    """What the receiver got for one upload.

    Attributes
    ----------
    symbols
        ``complex128``, shape ``(n_symbols,)``: received payload symbols, synchronised
        but **not** equalised: ``y = h x + n``.
    state
        The channel state the receiver knows.
    samples_sent, samples_received
        Counts at both ends of the link (samples for waveform links, symbols for the
        symbol link). A link raises :class:`LinkError` rather than return a reception with
        samples missing.
    airtime_s
        Payload air time in seconds (payload symbols / symbol rate).
    info
        Link-specific measurements (``snr_est_db``, ``cfo_est_hz``, ...).
    """

    symbols: np.ndarray
    state: ChannelState
    samples_sent: int
    samples_received: int
    airtime_s: float
    info: Mapping[str, float] = field(default_factory=dict)


def check_upload(symbols: np.ndarray, device: int, round_index: int) -> np.ndarray:
    """Validate ``transmit`` arguments; returns the symbols as ``complex128`` ``(n,)``.

    Every link applies the same contract: a non-empty 1-d payload and indices ``>= 0``.
    """
    x = np.asarray(symbols, dtype=np.complex128)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"symbols must be a non-empty 1-d array, got shape {x.shape}")
    if device < 0 or round_index < 0:
        raise ValueError(f"device and round_index must be >= 0, got {device}, {round_index}")
    return x


class LinkError(RuntimeError):
    """One upload was lost on the link (no frame found, samples missing, window missed).

    The link itself still works: the next upload may succeed. The message names the link,
    the device and the round, and says why the frame was lost. When the link as a whole is
    gone, the more specific :class:`LinkFailed` is raised instead.
    """


class ReceiverGap(LinkError):
    """A capture window overlaps a gap in the receiver's stream (samples lost: an overflow).

    Only the windows that overlap the gap are lost; the stream goes on, re-anchored at the
    USRP time of the first sample after the gap (its ``rx_time`` tag), so later windows are
    read as before. Never a :class:`LinkFailed`.

    Attributes
    ----------
    gap_start_s, gap_end_s
        USRP times (s) of the first missing sample and of the first sample after the gap
        (``gap_end_s - gap_start_s`` seconds lost; ``nan`` where not known).
    window_start_s, window_end_s
        The window asked for (USRP time, s).
    """

    def __init__(self, message: str, *, gap_start_s: float = float("nan"),
                 gap_end_s: float = float("nan"), window_start_s: float = float("nan"),
                 window_end_s: float = float("nan")) -> None:
        super().__init__(message)
        self.gap_start_s = gap_start_s
        self.gap_end_s = gap_end_s
        self.window_start_s = window_start_s
        self.window_end_s = window_end_s

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled with its attributes (the default passes only the message).
        return (type(self), (str(self),), dict(self.__dict__))

    def reworded(self, message: str) -> ReceiverGap:
        """The same gap under a new message (a caller that names its round)."""
        return type(self)(message, gap_start_s=self.gap_start_s, gap_end_s=self.gap_end_s,
                          window_start_s=self.window_start_s,
                          window_end_s=self.window_end_s)


class LinkFailed(LinkError):
    """The link itself is dead: no further upload over it can succeed.

    Raised when a flowgraph process failed to start or exited (the message names the
    process, its exit code and the tail of its log), when the sample stream's peer stopped
    answering or the stream's accounting broke, when no USRP was found at start, or when
    the link is used after ``close``. A caller that counts lost uploads must stop on this
    one rather than charge every later upload as lost.
    """


class Link(ABC):
    """One uplink medium shared by all devices. Use as a context manager."""

    #: Registry name (``symbol``, ``waveform``, ``gnuradio``, ``usrp``).
    name: str = ""
    #: ``True`` when ``transmit`` is guaranteed to report exactly the state ``probe``
    #: returned (simulated channel known to the receiver). Only then may a privacy budget
    #: be checked against a probed state; otherwise no channel noise is credited beforehand.
    exact_state: bool = False

    @property
    def noise_is_secret(self) -> bool:
        """``True`` when the receiver's additive noise cannot be regenerated from anything a
        run stores: physical receiver noise, or simulated noise from the OS CSPRNG
        (:mod:`radio.channel_noise`). Noise from a seeded generator (the channel generator,
        GNU Radio's seeded noise table) is not secret, and a run credits no channel noise
        over such a link (:mod:`testbed.core.channel_credit`). Default ``False``."""
        return False

    @abstractmethod
    def transmit(
        self,
        *,
        device: int,
        round_index: int,
        symbols: np.ndarray,
        rng: np.random.Generator,
    ) -> Reception:
        """Send one device's payload and return what the receiver got.

        Parameters
        ----------
        device
            Device index in ``[0, devices)``.
        round_index
            Global round (upload) index, from 0.
        symbols
            ``complex128``, shape ``(n_symbols,)``, already scaled by the device's power
            scaling ``alpha`` (symbol-power units).
        rng
            Generator for the *channel* of this device and round (fading, offsets), spawned
            from the experiment seed. The additive noise is drawn from it only on a link
            whose noise is not secret (:attr:`noise_is_secret`), and is then never credited;
            a secret link draws its noise elsewhere. Never used for privacy noise.

        Raises
        ------
        LinkFailed
            The link is dead (process exited, stream peer gone, link closed); stop using it.
        LinkError
            This upload was lost (e.g. no frame found); the link may carry the next one.
        ValueError
            Bad arguments (refused before anything is sent).
        """

    def probe(
        self, *, device: int, round_index: int, n_symbols: int, rng: np.random.Generator
    ) -> ChannelState | None:
        """The channel state the *next* ``transmit`` of this device and round will see.

        Simulated links draw the state here and reuse it in ``transmit`` (so a budget can be
        checked against the realized channel before the device transmits). Hardware links
        return ``None``: the state is unknown until received, and the budget check must then
        assume no channel-noise credit. ``rng`` must be the same generator later passed to
        ``transmit``.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release processes, sockets and radios. Idempotent."""

    def __enter__(self) -> Link:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
