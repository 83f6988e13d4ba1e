"""The collector: joins every process's events by request id and writes the run's tables."""
