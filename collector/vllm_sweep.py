"""A batchlab sweep written in `vllm bench sweep serve`'s layout (vLLM 0.32's vllm/benchmarks/sweep/serve.py):
a folder per point (strategy × backend × load) holding `summary.json`, the list of its repeats' results under
`vllm bench serve --save-result`'s keys, each with the sweep's parameters and its `run_number` as vLLM adds
them. `vllm bench sweep plot` and `plot_pareto` read such a folder as it is (`batchlab vllm bench sweep
plot_pareto DIR`)."""
import json
import re
from collections.abc import Iterable
from pathlib import Path

from batchlab.protocol.outcomes import MEASURED
from batchlab.collector.vllm_result import save_result
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir

SUMMARY = "summary.json"  # vLLM's name for a point's list of results


def point_name(label: str, backend: str, rate: float | None, concurrency: int) -> str:
    """'BENCH-label=dynamic-backend=sim-request_rate=4' (vLLM's BENCH-<its parameters>, made file-safe)."""
    load = f"request_rate={rate:g}" if rate is not None else f"max_concurrency={concurrency}"
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", f"BENCH-label={label}-backend={backend}-{load}")


def _result(folder: Path) -> dict:
    """A point run's vllm_result.json (written now where the sweep's point has none)."""
    path = RunDir(folder).vllm_result
    if not path.is_file():
        save_result(folder)
    return json.loads(path.read_text())


def write_vllm_sweep(records: Iterable, dest: str | Path) -> list[Path]:
    """Each done point of `records` (api.PointRecord: label, backend, rate, concurrency, repeat, folder,
    status) in `dest`/<point_name>/summary.json, repeats in order; the summary files written."""
    groups: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r.repeat):
        if r.status not in MEASURED:
            continue
        sweep = {"label": r.label, "backend": r.backend, "run_number": r.repeat,
                 **({"request_rate": r.rate} if r.rate is not None else {"max_concurrency": r.concurrency})}
        groups.setdefault(point_name(r.label, r.backend, r.rate, r.concurrency), []).append(
            _result(Path(r.folder)) | sweep)
    written = []
    for name, results in groups.items():
        path = Path(dest) / name / SUMMARY
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, results)
        written.append(path)
    return written
