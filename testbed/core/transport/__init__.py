"""The control plane's transport: CurveZMQ sockets and their keys, the endpoints they bind
and connect, and the protocol of the messages they carry.

:mod:`~testbed.core.transport.curve_keys` (key files), :mod:`~testbed.core.transport.secure_socket`
(the checks both ends share), :mod:`~testbed.core.transport.curve_server` and
:mod:`~testbed.core.transport.curve_client` (the two ends),
:mod:`~testbed.core.transport.endpoints` (addresses), :mod:`~testbed.core.transport.protocol`
(messages, with :mod:`~testbed.core.transport.protocol_schema` and
:mod:`~testbed.core.transport.protocol_checks`).
"""
