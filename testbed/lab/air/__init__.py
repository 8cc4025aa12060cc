"""The virtual air (``testbed air``): the channel between virtual USRPs.

Virtual transmitters push timed bursts (:mod:`radio.virtual_wire`); the air passes each
through its transmitter's path (:mod:`testbed.lab.air.paths`: loss, fading, carrier offset,
fractional delay), superposes them on fresh thermal noise from the OS CSPRNG on one sample
timeline (:mod:`testbed.lab.air.timeline`) and streams the result to the virtual receiver in
real time (:mod:`testbed.lab.air.process`). :class:`VirtualAir` is the model without sockets,
for tests; ``air.jsonl`` (:mod:`testbed.lab.air.log`) records every burst.
"""

from testbed.lab.air.air import AirCounts, VirtualAir
from testbed.lab.air.log import AIR_LOG, AirLog, read_air_log
from testbed.lab.air.paths import PathChannel, Received, fractional_delay_taps, place
from testbed.lab.air.process import run_air
from testbed.lab.air.timeline import Timeline, complex_noise

__all__ = [
    "AIR_LOG", "AirCounts", "AirLog", "PathChannel", "Received", "Timeline", "VirtualAir",
    "complex_noise", "fractional_delay_taps", "place", "read_air_log", "run_air",
]
