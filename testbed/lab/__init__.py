"""Launching a lab on one machine (``testbed launch``): the aggregator and N edge processes
over loopback. The processes themselves live in their rooms: ``aggregator/lab/`` and
``edge_device/lab/``."""
