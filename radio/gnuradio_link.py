"""The ``gnuradio`` link: frames through GNU Radio's channel models in a flowgraph process.

The flowgraph ``flowgraphs/channel_emulator.py`` (``channels.fading_model`` then
``channels.channel_model``) runs under ``/usr/bin/python3``; samples travel over ZeroMQ
PUSH/PULL (:mod:`radio.zmq_stream`) and parameters over XML-RPC. Per upload the link sets
the device's noise voltage (``sqrt(N0)`` per sample, see :mod:`radio.waveform_channel`) and
frequency offset, prepends a random delay, streams the frame, and demodulates what comes
back.

The channel noise comes from one of two sources in the flowgraph (``noise``):

* ``fast``: ``channel_model``'s own fast noise source, a table of samples pre-drawn from
  ``noise_seed`` and replayed. A run is then reproducible as a whole sequence of uploads,
  but anyone with the run directory can regenerate the noise: it is not secret
  (:attr:`GnuradioLink.noise_is_secret` is ``False``) and never credited.
* ``csprng``: every noise sample drawn fresh from the OS CSPRNG in the flowgraph process
  (``flowgraphs/csprng_noise.py``, the devices' own Gaussian sampler, added in the same
  work call as the signal passes); nothing in a run regenerates it, so it is secret
  (``noise_is_secret``). Its statistics are tested (``tests/test_flowgraph_noise.py``).
  ``testbed run`` still builds this link with ``fast`` (:func:`testbed.core.links.make_link`):
  a credit on a link whose channel is known only after reception needs a budget gate
  before transmission that can count channel noise, which the testbed does not have yet
  (docs/radio.md, "Secret noise over the gnuradio link").

A frame that is not found, or an upload only partly back in time, is a lost upload
(:class:`~radio.link.LinkError`); a flowgraph that failed to start, exited, or whose output
stream stopped altogether is a dead link (:class:`~radio.link.LinkFailed`, naming the
process, its exit code and the tail of its log).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from radio.fading import doppler_hz
from radio.flowgraph_process import (
    FLOWGRAPH_DIR,
    SYSTEM_PYTHON,
    FlowgraphError,
    FlowgraphProcess,
    free_tcp_port,
)
from radio.frame_link import Carried, FrameLink
from radio.framing import WaveformParams
from radio.link import LinkError, LinkFailed
from radio.symbol_link import ChannelParams
from radio.units import db_to_linear
from radio.waveform_channel import EmulatorParams
from radio.zmq_stream import SampleStream, StreamBroken, StreamTimeout

#: Zero samples streamed (and discarded) after a noise or frequency change: GNU Radio's
#: noise and carrier sources run ahead of the signal by up to a buffer (measured: a
#: change shows after at most ~16k samples; 64k leaves a wide margin).
SETTLE_SAMPLES = 65536
#: The flowgraph's noise sources (``flowgraphs/channel_emulator.py --noise-source``).
NOISE_SOURCES = ("fast", "csprng")


class GnuradioLink(FrameLink):
    """Pulse-shaped frames through a GNU Radio channel-emulator process.

    Parameters
    ----------
    channel
        Per-device SNR and fading kind (shared with the other links).
    waveform
        Frame numerology; sets the sample rate.
    emulator
        ``cfo_hz``, ``cfo_spread_hz``, ``delay_max_samples``, ``tail_samples``,
        ``speed_kmh`` and ``carrier_hz`` (Doppler) are used; ``sro_ppm`` must be 0 (sample
        accounting is exact only at equal clocks).
    noise
        ``fast`` (GNU Radio's seeded noise table) or ``csprng`` (fresh from the OS CSPRNG).
    noise_seed, fading_seed
        Seeds of GNU Radio's noise (``fast`` only) and fading generators.
    python
        Interpreter that runs the flowgraph.
    startup_timeout_s
        Start-up limit of the flowgraph process.
    log_dir
        Folder for the flowgraph's log (``channel_emulator.log``, kept); ``None``: an
        anonymous temporary file, gone when the link is closed.
    **kwargs
        Passed to :class:`~radio.frame_link.FrameLink`.
    """

    name = "gnuradio"
    #: Seconds an upload may take to come back, beyond 5 us per sample. A flowgraph that
    #: returns nothing at all in that time is taken for dead (:class:`LinkFailed`).
    stream_timeout_s: float = 10.0

    def __init__(
        self,
        channel: ChannelParams,
        waveform: WaveformParams,
        emulator: EmulatorParams | None = None,
        *,
        noise: str = "fast",
        noise_seed: int = 0,
        fading_seed: int = 0,
        python: str = SYSTEM_PYTHON,
        startup_timeout_s: float = 60.0,
        log_dir: Path | None = None,
        **kwargs: object,
    ) -> None:
        if noise not in NOISE_SOURCES:
            raise ValueError(f"noise: got {noise!r}; allowed: {', '.join(NOISE_SOURCES)}")
        super().__init__(waveform, **kwargs)  # type: ignore[arg-type]
        self.noise = noise
        self.channel = channel
        self.emulator = emulator or EmulatorParams()
        if self.emulator.sro_ppm != 0.0:
            raise ValueError(
                f"emulator.sro_ppm: got {self.emulator.sro_ppm}; the gnuradio link needs 0 "
                "(use the waveform link to emulate sample-rate offsets)"
            )
        fading = "none" if channel.noiseless else channel.fading
        fs = waveform.sample_rate_hz
        fdts = 0.0
        if fading != "none":
            if self.emulator.speed_kmh <= 0:
                raise ValueError(
                    f"fading '{fading}' over the gnuradio link needs waveform.speed_kmh > 0 "
                    "(GNU Radio's fading_model is a Doppler process), got "
                    f"{self.emulator.speed_kmh}"
                )
            fdts = doppler_hz(self.emulator.speed_kmh, self.emulator.carrier_hz) / fs
        self.stream = SampleStream()
        out_address = f"tcp://127.0.0.1:{free_tcp_port()}"
        args = [
            "--in-address", self.stream.in_address,
            "--out-address", out_address,
            "--samp-rate", repr(fs),
            "--noise-source", noise,
            "--noise-seed", str(int(noise_seed)),
            "--fading-on", "0" if fading == "none" else "1",
            "--fdts", repr(fdts),
            "--los", "1" if fading == "rician" else "0",
            "--k-factor", repr(float(db_to_linear(channel.rician_k_db))),
            "--fading-seed", str(int(fading_seed)),
        ]
        self.process: FlowgraphProcess | None = None
        self._noise_voltage = 0.0
        self._cfo_norm = 0.0
        try:
            self.process = FlowgraphProcess(
                FLOWGRAPH_DIR / "channel_emulator.py", args, python=python,
                startup_timeout_s=startup_timeout_s, log_dir=log_dir,
            )
            self.stream.connect(out_address)
        except FlowgraphError as exc:
            self.close()
            raise LinkFailed(f"gnuradio link could not start: {exc}") from exc
        except BaseException:
            # KeyboardInterrupt during start-up included: no process or socket survives.
            self.close()
            raise

    @property
    def noise_is_secret(self) -> bool:
        """``True`` with the ``csprng`` noise source; GNU Radio's seeded fast noise table
        (``fast``) is never credited."""
        return self.noise == "csprng"

    def _set(self, method: str, value: float) -> None:
        assert self.process is not None
        self.process.call(method, float(value))

    def _carry(
        self, samples: np.ndarray, *, device: int, round_index: int, rng: np.random.Generator
    ) -> Carried:
        if self.process is None:
            raise LinkFailed("gnuradio link is closed")
        if not 0 <= device < len(self.channel.snr_db):
            raise ValueError(f"device {device} outside [0, {len(self.channel.snr_db)})")
        fs = self.waveform.sample_rate_hz
        n0 = self.channel.noise_var(device)
        cfo = self.emulator.cfo_hz + float(
            rng.uniform(-self.emulator.cfo_spread_hz, self.emulator.cfo_spread_hz)
        )
        delay = int(rng.integers(0, int(self.emulator.delay_max_samples) + 1))
        buffer = np.concatenate(
            [np.zeros(delay), samples, np.zeros(self.emulator.tail_samples)]
        )
        rx = self._stream(buffer, n0, cfo / fs, device, round_index)
        info = {"noise_var_true": n0, "cfo_true_hz": cfo, "delay_true_samples": float(delay)}
        return Carried(rx.astype(np.complex128), buffer.size, rx.size, info)

    def carry_air(self, samples: np.ndarray, *, noise_var: float,
                  rng: np.random.Generator) -> Carried:
        """The slot's samples through the flowgraph with noise voltage ``sqrt(noise_var)``
        and no frequency offset (a shared reference); its fading, if on, still applies."""
        if self.process is None:
            raise LinkFailed("gnuradio link is closed")
        buffer = np.asarray(samples, dtype=np.complex128)
        rx = self._stream(buffer, noise_var, 0.0, -1, -1)
        return Carried(rx.astype(np.complex128), buffer.size, rx.size,
                       {"noise_var_true": float(noise_var)})

    def _stream(self, buffer: np.ndarray, n0: float, cfo_norm: float, device: int,
                round_index: int) -> np.ndarray:
        """``buffer`` through the flowgraph at noise ``n0`` per sample and normalised
        frequency offset ``cfo_norm``; what came back, ``complex`` ``(buffer.size,)``."""
        assert self.process is not None
        preroll = 0
        try:
            if np.sqrt(n0) != self._noise_voltage:
                preroll = SETTLE_SAMPLES
                self._set("set_noise_voltage", np.sqrt(n0))
                self._noise_voltage = float(np.sqrt(n0))
            if cfo_norm != self._cfo_norm:
                preroll = SETTLE_SAMPLES
                self._set("set_frequency_offset", cfo_norm)
                self._cfo_norm = cfo_norm
            timeout = self.stream_timeout_s + buffer.size / 2e5
            return self.stream.exchange(
                buffer, timeout_s=timeout, preroll=preroll, alive=self.process.check_alive
            )
        except (FlowgraphError, StreamBroken) as exc:
            raise LinkFailed(
                f"gnuradio link failed at device {device}, round {round_index}: {exc}"
            ) from exc
        except StreamTimeout as exc:
            raise self._timeout_error(exc, device, round_index) from exc

    def _timeout_error(self, exc: StreamTimeout, device: int, round_index: int) -> LinkError:
        """A late upload is lost; a flowgraph that produced nothing at all is dead."""
        assert self.process is not None
        where = f"device {device}, round {round_index}"
        try:
            self.process.check_alive()
        except FlowgraphError as dead:
            return LinkFailed(f"gnuradio link failed at {where}: {dead}")
        if exc.produced == 0:
            return LinkFailed(
                f"gnuradio link failed at {where}: flowgraph {self.process.name} "
                f"(pid {self.process.pid}) is running but its output stream produced no "
                f"sample while waited for ({exc})"
            )
        return LinkError(f"gnuradio link: upload of {where} lost: {exc}")

    def samples_in_flowgraph(self) -> tuple[int, int]:
        """(samples the flowgraph's source produced, samples its channel block output)."""
        if self.process is None:
            raise LinkFailed("gnuradio link is closed")
        return (
            int(self.process.call_float("get_samples_in")),
            int(self.process.call_float("get_samples_out")),
        )

    def close(self) -> None:
        """Stop the flowgraph process and close the sockets. Idempotent."""
        try:
            if self.process is not None:
                self.process.stop()
        finally:
            self.process = None
            self.stream.close()
