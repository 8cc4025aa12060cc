"""The edge agent process of a lab run (``testbed edge``, one per Jetson): joins the
aggregator, trains and encodes with ``edge_device``'s objects, keeps its own ledger and
budget, transmits (its own USRP burst on the ``usrp`` link), 002's secure-aggregation client
phases."""
