"""`batchlab calibrate --from RUN_DIR...`: the step model fitted to what live workers executed in runs.

A RUN_DIR is a run folder (summary.json) or a folder holding some (a sweep: every point under it).
The runs must share one backend kind (hf static, hf-loop, vllm or sim: lab.sim_plan' kinds), chosen
with --kind when the folders hold several; their constants (weights, KV bytes per token, padding,
fusion, the per-step token budget) come from what the worker reported in the run's settings.
"""
import math
import os
import time
from collections.abc import Callable
from pathlib import Path


from batchlab.lab.sim_plan import CALIBRATED_KIND
from batchlab.protocol.run_dir import SUMMARY_FILE, RunDir
from batchlab.collector.layout import CAPACITY_DIR, PROBE_DIR, SATURATED_DIR, WORKERS_DIR
from batchlab.collector.summary import read_summary
from batchlab.protocol.setting_groups import BatchlabError

NOT_POINTS = {PROBE_DIR, SATURATED_DIR, CAPACITY_DIR, WORKERS_DIR}  # bursts, saturated runs, probes, workers' own
KIND_ORIGIN = {kind: key for key, kind in CALIBRATED_KIND.items()}  # hf-loop -> (hf, continuous)


class CalibrateError(BatchlabError, ValueError):
    """Runs that cannot be calibrated from; the CLI prints it as one line."""


def run_folders(dirs: list[str]) -> list[Path]:
    """Every run folder at or under each of `dirs`, in order, but a sweep's probes and searches (NOT_POINTS)."""
    found = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise CalibrateError(f"--from {d}: no such folder")
        runs = [d] if RunDir(d).summary.is_file() else sorted(p.parent for p in d.rglob(SUMMARY_FILE))
        runs = [r for r in runs if not set(r.relative_to(d).parts) & NOT_POINTS]
        if not runs:
            raise CalibrateError(f"--from {d}: no run folder (summary.json) in it")
        found += runs
    return found


def run_facts(run: Path) -> dict:
    """A run's backend kind and the fit's constants, from its summary's settings and its worker's hello."""
    from batchlab.worker.calibrate_runs import Constants

    settings = read_summary(run).settings
    workers = settings.get("workers") or {}
    hello = next(iter(workers.values()), {}) if isinstance(workers, dict) else {}
    backend, mode = hello.get("backend") or settings.get("backend"), hello.get("mode")
    mode = mode or ("continuous" if RunDir(run).table("steps").is_file() else "static")
    kind = CALIBRATED_KIND.get((backend, mode), backend)
    preset = hello.get("preset") if isinstance(hello.get("preset"), dict) else {}
    n_params = hello.get("n_params") or 0
    weights = preset.get("weights_bytes") or float(n_params * (4 if hello.get("dtype", "float32") == "float32" else 2))
    padded = preset["padded"] if "padded" in preset else backend == "hf"
    fused = preset["fused"] if "fused" in preset else kind in ("hf-loop", "vllm")  # one forward a step
    memory = preset.get("memory_bytes") or (hello.get("kv_budget_bytes", 0) + weights) / 0.9
    device = str(hello.get("device", settings.get("device", "")))
    return {"kind": kind, "backend": backend, "mode": mode, "device": device, "model": settings.get("model"),
            "constants": Constants(float(weights), int(hello.get("kv_bytes_per_token") or 0), float(memory),
                                   bool(padded), bool(fused), _step_tokens(hello, preset, kind))}


def _step_tokens(hello: dict, preset: dict, kind: str) -> int:
    """The worker's per-step token budget: the HF loop's (its hello says it), a sim worker's preset's; 0 for
    static batches and for vLLM (its chunked-prefill default leaves this project's prompts whole)."""
    if kind == "hf-loop":
        return int(hello.get("max_num_batched_tokens") or 0)
    return int(preset.get("step_tokens") or 0)


def chosen_runs(dirs: list[str], kind: str) -> tuple[list[Path], dict]:
    """The runs of one kind and that kind's facts; CalibrateError naming the kinds when they are mixed."""
    runs = run_folders(dirs)
    facts = {run: run_facts(run) for run in runs}
    kinds = sorted({f["kind"] for f in facts.values()})
    if kind:
        runs = [r for r in runs if facts[r]["kind"] == kind]
        if not runs:
            raise CalibrateError(f"--kind {kind}: none of these runs ran on it (they ran on {', '.join(kinds)})")
    elif len(kinds) > 1:
        raise CalibrateError(f"these runs ran on {', '.join(kinds)}: a step model is one backend's; "
                             f"choose one with --kind ({' | '.join(kinds)})")
    return runs, facts[runs[0]]


def calibrate_from(dirs: list[str], *, kind: str, form: str, out: str, name: str, weigh: str = "steps",
                   say: Callable[[str], None] | None = None, show: Callable | None = None) -> dict:
    """Read the runs' executed steps, fit, write the preset; the record. `say`: a line before fitting and one
    after writing; `show(table, record)`: the per-shape table (a DataFrame) and the record, before the preset
    is written."""
    import pandas as pd

    from batchlab.worker.calibrate_runs import fit_runs, total_time_error
    from batchlab.worker.run_steps import read_run_steps
    from batchlab.worker.stepmodel import save_preset

    started = time.monotonic()
    runs, facts = chosen_runs(dirs, kind)
    form = form if form != "auto" else ("memory" if "cuda" in facts["device"] else "compute")
    steps = pd.concat([read_run_steps(r, facts["constants"].padded).steps for r in runs], ignore_index=True)
    say = say or (lambda line: None)
    say(f"calibrating {facts['kind']} from {len(runs)} run(s): {len(steps)} executed steps, form {form}")
    model, table = fit_runs(steps, name, form, facts["constants"], weigh)
    record = {**_record(facts, runs, table, total_time_error(model, steps), started), "weigh": weigh}
    if show is not None:
        show(table, record)
    save_preset(model, out, record)
    say(f"wrote {out} (use --preset {facts['kind']}={out})")
    return record


def _summary(table, key: str) -> dict:
    out = {}
    for kind, rows in table.groupby("kind"):
        values = rows[key].abs().dropna()
        if len(values):
            out[str(kind)] = {"mean_abs": round(float(values.mean()), 4), "worst_abs": round(float(values.max()), 4)}
    return out


def _record(facts: dict, runs: list[Path], table, total_error: float, started: float) -> dict:
    backend, mode = KIND_ORIGIN.get(facts["kind"], (facts["backend"], facts["mode"]))
    shapes = [{k: (None if isinstance(v, float) and math.isnan(v) else (round(v, 6) if isinstance(v, float) else v))
               for k, v in row.items()} for row in table.to_dict("records")]
    return {"backend": backend, "mode": mode, "model": facts["model"], "device": facts["device"],
            "from_runs": [str(r) for r in runs], "measured": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_1m": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started, 1),
            "steps": int(table["steps"].sum()), "total_time_error": round(total_error, 4),
            "fit_error": _summary(table, "fit_error"), "held_out_error": _summary(table, "held_out_error"),
            "shapes": shapes}
