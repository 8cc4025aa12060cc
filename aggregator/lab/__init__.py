"""The aggregator process of a lab run (``testbed aggregator``): control plane, the edges as
the round loop's remote devices, the TDMA capture of the ``usrp`` link, 002's secure-
aggregation server phases, and resume after a restart."""
