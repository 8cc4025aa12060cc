"""ZeroMQ endpoint checks: the one place that says whether ``tcp://HOST:PORT`` is usable.

Used for the lab's ``--bind`` / ``--connect`` (:mod:`testbed.cli.cmd_aggregator`,
:mod:`testbed.cli.cmd_edge`) and for the virtual air's ``virtual_air.burst_address`` and
``virtual_air.stream_address`` (:mod:`testbed.core.config.virtual_air`). A TCP port outside
1..65535 is refused: libzmq would otherwise bind some other port, or connect nowhere and
wait forever. This module imports nothing else of the package.
"""

from __future__ import annotations

import re

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/\[\]]+):(?P<port>[^:/]*)$")
#: Largest TCP port.
MAX_PORT = 65535


def endpoint_problem(endpoint: str, *, bind: bool, tcp_only: bool = False) -> str | None:
    """What is wrong with ``endpoint``, without repeating it (``None``: usable).

    Parameters
    ----------
    endpoint
        The endpoint as given.
    bind
        ``True`` for a bind endpoint: port ``*`` (any free port) is allowed there.
    tcp_only
        Refuse other zmq transports (``ipc://``, ``inproc://``); otherwise libzmq checks them.

    Returns
    -------
    str or None
        ``"<what is wrong>; allowed: <what is>"``, for the caller to put after the option's
        name and the value given; ``None`` when the endpoint is usable.
    """
    allowed = f"1..{MAX_PORT}" + (" or * (any free port)" if bind else "")
    if not endpoint.startswith("tcp://"):
        if "://" in endpoint and not tcp_only:
            return None
        return f"allowed: tcp://HOST:PORT (PORT {allowed})"
    m = _TCP.match(endpoint)
    if m is None:
        return f"allowed: tcp://HOST:PORT (PORT {allowed})"
    if not bind and m.group("host") == "*":
        return "host '*' (every interface) can only be bound; allowed: a host to connect to"
    port = m.group("port")
    if bind and port == "*":
        return None
    if not port.isdigit() or not 1 <= int(port) <= MAX_PORT:
        return f"port {port!r} is out of range; allowed: PORT {allowed}"
    return None


def check_endpoint(endpoint: str, flag: str, *, bind: bool, tcp_only: bool = False) -> str:
    """Return ``endpoint`` if it is a usable ``tcp://HOST:PORT`` (or another zmq transport).

    Parameters
    ----------
    endpoint
        The endpoint as given.
    flag
        The option or key it came from (named in the error).
    bind
        ``True`` for a bind endpoint: port ``*`` (any free port) is allowed there.
    tcp_only
        Refuse other zmq transports.

    Raises
    ------
    ValueError
        ``"{flag}: got {endpoint!r}; ..."`` (:func:`endpoint_problem`): a tcp endpoint
        without a port, or a port that is not ``1..65535`` (``*`` when binding).
    """
    problem = endpoint_problem(endpoint, bind=bind, tcp_only=tcp_only)
    if problem is not None:
        raise ValueError(f"{flag}: got {endpoint!r}; {problem}")
    return endpoint
