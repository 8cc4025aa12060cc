"""A bench's first-day radio measurements (``testbed radio calibrate``).

:mod:`radio.calibration.bench` drives the ``tx``/``rx`` flowgraphs (timed bursts, noise
captures, the stream watched for overflows, a late burst on purpose);
:mod:`radio.calibration.estimates` turns what they return into estimates with confidence
bounds. Neither knows about experiments or hardware configs (the testbed's
:mod:`testbed.radio_calibration` does).
"""
