"""The statistics a study uses: intervals, saturation, the sustain verdict, capacity estimates, quantiles, metrics
and the machine's interference; pure functions over tables, shared by the collector, the report and lab."""
