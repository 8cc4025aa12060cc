"""``testbed radio calibrate``: a bench's radios measured into a hardware config's
``calibration`` section (:mod:`testbed.radio_calibration.measure`), checked against a virtual
config's truth (:mod:`testbed.radio_calibration.truth`) and written up as a markdown report
with figures (:mod:`testbed.radio_calibration.report`). docs/lab.md, "Calibration".
"""
