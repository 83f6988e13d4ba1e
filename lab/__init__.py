"""Experiments made of runs: sweep plans, their points and repeats, the capacity search, simulate's plans and
runs, tune's search, calibration from runs, and the fan-out of independent ones over processes or Ray."""
