"""Names of the files and folders in a run folder and a sweep folder (written by the collector and
the sweep, read by the report)."""

SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.json"  # request counts while a run goes (collector → launcher)
RUN_FILE = "run.json"  # a run's identity (config hash), environment, start/end and status
INDEX_FILE = "sweep.json"  # a sweep's index of points
DONE_FILE = "point.json"  # a point whose run returned (summary.json alone is also written on failure)
FAILED_FILE = "FAILED.txt"  # a point that failed, with the reason
PROBE_DIR = "_probe"  # the capacity probe of a sweep with automatic rates
WORKERS_DIR = "_workers"  # a sweep's warm workers' own output (start-up, between points)
VLLM_RESULT_FILE = "vllm_result.json"  # a run's figures under `vllm bench serve --save-result`'s keys
