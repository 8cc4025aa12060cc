"""The air's real-time loop: bursts in over ZeroMQ, the receiver's stream out, wall-clock paced.

The air binds a PULL socket at ``virtual_air.burst_address`` (the transmitters connect and
push bursts) and a PUSH socket at ``virtual_air.stream_address`` (the one receiver connects
and pulls chunks). It renders air time ``t`` at host time ``t + render_delay_s``, a chunk of
``chunk_s`` at a time: between chunks it waits on the burst socket (no busy wait); behind
schedule (a loaded host) it renders every chunk due in a row, taking bursts in between, and
never skips a sample. A chunk the receiver cannot take at once (none connected, or its queue
of :data:`STREAM_QUEUE_S` full) is dropped and counted: the receiver sees a gap in ``index``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

import zmq

from radio.virtual_wire import encode_chunk
from testbed.lab.air.air import VirtualAir

#: Seconds of stream the PUSH socket queues for a slow receiver before chunks are dropped.
STREAM_QUEUE_S = 2.0
#: Longest wait (s) between looks at the stop event and the parent process.
MAX_WAIT_S = 0.2


def parent_alive(pid: int, was_parent: bool) -> bool:
    """Whether process ``pid`` still runs; ``was_parent``: it was this process' parent at start
    (then a changed parent pid means it is gone, even if the pid was reused)."""
    if was_parent and os.getppid() != pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def run_air(air: VirtualAir, stop: threading.Event, *, parent_pid: int | None = None,
            clock: Callable[[], float] = time.time,
            on_bound: Callable[[], None] | None = None) -> dict[str, object]:
    """Run ``air`` in real time until ``stop`` is set or ``parent_pid`` is gone.

    Parameters
    ----------
    air
        The air (its ``t0`` is the start time; sample ``k`` renders at host time
        ``t0 + k / fs + render_delay_s``).
    stop
        Set it to stop (e.g. from a signal handler).
    parent_pid
        Stop when this process is gone; ``None``: never.
    clock
        True time (s).
    on_bound
        Called once both sockets are bound (the start line goes out there).

    Returns
    -------
    dict
        :meth:`VirtualAir.summary` (the air is closed, its log and the sockets too, also
        when binding fails: ``zmq.ZMQError``).
    """
    delay = air.air.render_delay_s
    was_parent = parent_pid is not None and os.getppid() == parent_pid
    ctx = zmq.Context()
    bursts = ctx.socket(zmq.PULL)
    stream = ctx.socket(zmq.PUSH)
    try:
        for sock in (bursts, stream):
            sock.setsockopt(zmq.LINGER, 0)
        stream.setsockopt(zmq.SNDHWM, max(4, math.ceil(STREAM_QUEUE_S / air.air.chunk_s)))
        bursts.bind(air.air.burst_address)
        stream.bind(air.air.stream_address)
        if on_bound is not None:
            on_bound()
        poller = zmq.Poller()
        poller.register(bursts, zmq.POLLIN)

        def take_bursts() -> None:
            while True:
                try:
                    frames = bursts.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                air.take(frames)

        next_parent_check = clock()
        while not stop.is_set():
            now = clock()
            if parent_pid is not None and now >= next_parent_check:
                if not parent_alive(parent_pid, was_parent):
                    break
                next_parent_check = now + MAX_WAIT_S
            take_bursts()
            target = now - delay
            due = air.chunks_due(target)
            if due:
                air.note_lag(target)
            for _ in range(due):
                header, samples = air.render_chunk()
                try:
                    stream.send_multipart(encode_chunk(header, samples), zmq.NOBLOCK)
                    air.counts.chunks_sent += 1
                except zmq.Again:
                    air.counts.chunks_dropped += 1
                take_bursts()
                if stop.is_set():
                    break
            wait = air.index_time(air.next_index + air.chunk_samples) + delay - clock()
            wait = min(MAX_WAIT_S, max(0.001, wait))
            poller.poll(timeout=math.ceil(wait * 1000))
    finally:
        bursts.close(0)
        stream.close(0)
        ctx.term()
        air.close()
    return air.summary()
