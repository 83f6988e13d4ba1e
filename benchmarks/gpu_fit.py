"""Fit the GPU presets' engine terms to the published measurements' fit set and write worker/presets/gpu/engines.yaml.

    python benchmarks/gpu_fit.py                         # fit, print the fit set's errors, write the terms file
    python benchmarks/gpu_fit.py --dry-run               # fit and print only

The parameters (worker/gpu_presets.py): η_mem and η_flop per GPU die, shared by every engine version (the GPU
kernels' reach of the datasheet figures), and per engine version (a measurement's `terms`) the per-step
overhead c_step, the per-row overhead c_row and, for runs through its HTTP server, the per-request front-end
cost. The objective is the sum of absolute log errors of the fit set's scored figures, each configuration
replayed in the simulator (simulator.published.predict); the search is a bounded pattern search in log space,
block by block (the efficiencies, then each engine's terms). The check set is never read. The HF presets' terms
come from the presets' vLLM terms plus the one published difference between HF generate() and vLLM per-token
latency (HF_STEP_EXTRA_S). It takes 1.5 to 5 minutes on a 2-core VM (an evaluation replays the 14 fit
configurations).
"""
import argparse
import datetime
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchlab.simulator.measurements import Measurement, load_measurements  # noqa: E402
from batchlab.simulator.published import group_errors, predict, rows_of  # noqa: E402
from batchlab.worker.gpu_presets import TERMS_FILE, Efficiency, EngineTerms, Terms  # noqa: E402
from batchlab.worker.gpus import get_gpu  # noqa: E402

MEASUREMENTS = ROOT / "benchmarks" / "published" / "measurements.yaml"
BOUNDS = {"mem": (0.3, 1.0), "flop": (0.15, 1.0), "step_overhead_s": (1e-5, 0.05), "row_overhead_s": (1e-7, 2e-3),
          "request_overhead_s": (1e-5, 0.05)}
START = {"mem": 0.85, "flop": 0.6, "step_overhead_s": 0.002, "row_overhead_s": 5e-5, "request_overhead_s": 0.002}
ENGINE_TERMS = ("step_overhead_s", "row_overhead_s", "request_overhead_s")
# HF generate() (text-generation-webui, transformers 4.35.2) and vLLM 0.2.4, RTX 4090, Yi-6B-Chat bf16, one
# stream, 512-token prompt, 200 tokens: latency per token 22.378 ms against 15.952 ms
# (https://github.com/ninehills/llm-inference-benchmark, BENCHMARK.md and README.md): the eager HF loop's extra
# cost per step, the only published HF figure found beside a vLLM one on the same GPU and model.
HF_STEP_EXTRA_S = 0.022378 - 0.015952
# The presets' engines (docs/simulator.md says why): `vllm-v1`, vLLM's own CI's fitted overheads with V1's scheduling
# (a step's prompts and decodes in one forward), and `hf-eager`, those plus HF_STEP_EXTRA_S, padded, unfused.
PRESET_ENGINE = "vllm-ci"


class Fit:
    """The fit set's objective over named parameters, each configuration's replay cached on what it depends on.

    Parameters: `mem:CHIP` and `flop:CHIP` (each GPU die the fit set has), and per engine version its step and
    row overheads and, when its fit configurations went through its HTTP server, the request one."""

    def __init__(self, measurements: list[Measurement], facts: dict[str, dict]) -> None:
        self.fit = [m for m in measurements if m.split == "fit"]
        self.chips = sorted({get_gpu(m.gpu).chip for m in self.fit})
        self.engines = sorted({m.terms for m in self.fit})
        self.facts = facts
        serving = {m.terms for m in self.fit if m.serving}
        self.names = [*(f"{k}:{c}" for c in self.chips for k in ("mem", "flop")),
                      *(f"{e}:{t}" for e in self.engines for t in ENGINE_TERMS
                        if t != "request_overhead_s" or e in serving)]
        self.cache: dict[tuple, list] = {}
        self.evaluations = 0

    def terms(self, values: dict[str, float]) -> Terms:
        """A terms object of named parameter values."""
        eff = {c: Efficiency(values[f"mem:{c}"], values[f"flop:{c}"]) for c in self.chips}
        engines = {e: EngineTerms(e, values[f"{e}:step_overhead_s"], values[f"{e}:row_overhead_s"],
                                  values.get(f"{e}:request_overhead_s", 0.0), **self.facts.get(e, {}))
                   for e in self.engines}
        return Terms(eff, engines, {})

    def rows(self, terms: Terms, measurements: list[Measurement]) -> list:
        """Every figure of `measurements` beside its prediction under `terms`."""
        out = []
        for m in measurements:
            eff, t = terms.efficiency[get_gpu(m.gpu).chip], terms.engines[m.terms]
            key = (m.id, eff, t)
            if key not in self.cache:
                self.cache[key] = rows_of(m, predict(m, terms))
            out += self.cache[key]
        return out

    def objective(self, values: dict[str, float]) -> float:
        """Σ |log(predicted ÷ published)| over the fit set's scored figures: absolute, not squared, so that a
        figure no term explains moves the fit less than the many it can."""
        self.evaluations += 1
        return sum(abs(math.log(r.predicted / r.published)) for r in self.rows(self.terms(values), self.fit)
                   if r.scored)


def _kind(name: str) -> str:
    """A parameter's kind: mem, flop or an engine term's name."""
    head, tail = name.split(":")
    return head if head in ("mem", "flop") else tail


def _bounds(name: str) -> tuple[float, float]:
    lo, hi = BOUNDS[_kind(name)]
    return math.log(lo), math.log(hi)


def pattern_search(f, values: dict[str, float], names: list[str], max_evals: int) -> tuple[dict, float, int]:
    """Minimise f over `names` (the other values held) in log space within BOUNDS: each round moves every
    parameter to the best of × and ÷ the step when that lowers f; the step halves after a round that moved
    nothing; stops at a step of 1% or `max_evals` evaluations."""
    x = {n: math.log(values[n]) for n in names}
    best, step, evals = f({**values, **{n: math.exp(v) for n, v in x.items()}}), 0.5, 1
    while step > 0.01 and evals < max_evals:
        moved = False
        for n in names:
            lo, hi = _bounds(n)
            trials = {min(max(x[n] + d, lo), hi) for d in (step, -step)} - {x[n]}
            for v in trials:
                value = f({**values, **{k: math.exp(w) for k, w in {**x, n: v}.items()}})
                evals += 1
                if value < best - 1e-12:
                    best, x[n], moved = value, v, True
        if not moved:
            step /= 2
    return {**values, **{n: math.exp(v) for n, v in x.items()}}, best, evals


def fit_terms(fit: Fit, max_evals: int, rounds: int = 2) -> tuple[dict[str, float], float]:
    """Block coordinate descent: the GPU dies' efficiencies over the whole fit set, then each engine's terms
    (which only its own configurations see), `rounds` times."""
    values = {n: START[_kind(n)] for n in fit.names}
    best = math.inf
    for r in range(rounds):
        shared = [n for n in fit.names if _kind(n) in ("mem", "flop")]
        values, best, _ = pattern_search(fit.objective, values, shared, max_evals)
        for e in fit.engines:
            mine = [n for n in fit.names if n.startswith(f"{e}:")]
            values, best, _ = pattern_search(fit.objective, values, mine, max_evals)
        print(f"  round {r + 1}: objective {best:.4f} after {fit.evaluations} evaluations", flush=True)
    return values, best


def terms_document(fit: Fit, values: dict[str, float], objective: float, measurements: list[Measurement]) -> dict:
    """engines.yaml's content: the GPU dies' efficiency, every engine's terms, the HF terms, the presets' map
    and the fit's record."""
    terms = fit.terms(values)
    ref = terms.engines[PRESET_ENGINE]
    v1 = replace(ref, name="vllm-v1", request_overhead_s=0.0, fused=True, step_tokens=0, front_end_blocks=False,
                 async_output=False)
    hf = replace(ref, name="hf-eager", step_overhead_s=ref.step_overhead_s + HF_STEP_EXTRA_S, request_overhead_s=0.0,
                 padded=True, fused=False, step_tokens=0, front_end_blocks=False, async_output=False)
    errors = group_errors(fit.rows(terms, fit.fit), "fit")
    return {"efficiency": {c: {"mem": round(e.mem, 4), "flop": round(e.flop, 4)} for c, e in terms.efficiency.items()},
            "engines": {e: _plain(t) for e, t in {**terms.engines, "vllm-v1": v1, "hf-eager": hf}.items()},
            "presets": {"vllm": "vllm-v1", "hf": "hf-eager", "hf-loop": "hf-eager"},
            "fit": {"command": "python benchmarks/gpu_fit.py", "date": datetime.date.today().isoformat(),
                    "measurements": str(MEASUREMENTS.relative_to(ROOT)),
                    "fit_set": [m.id for m in measurements if m.split == "fit"],
                    "objective_sum_abs_log_error": round(objective, 5), "evaluations": fit.evaluations,
                    "fit_set_error": {e.group: {"median": round(e.median, 4), "worst": round(e.worst, 4),
                                                "figures": e.count} for e in errors},
                    "hf_step_extra_s": round(HF_STEP_EXTRA_S, 6),
                    "hf_source": "https://github.com/ninehills/llm-inference-benchmark (README.md, BENCHMARK.md)"}}


def _plain(t: EngineTerms) -> dict:
    out = {"step_overhead_s": float(f"{t.step_overhead_s:.4g}"), "row_overhead_s": float(f"{t.row_overhead_s:.4g}")}
    if t.request_overhead_s:
        out["request_overhead_s"] = float(f"{t.request_overhead_s:.4g}")
    out.update(step_tokens=t.step_tokens, fused=t.fused)
    if t.prefill_alone:
        out["prefill_alone"] = True
    if t.front_end_blocks:
        out["front_end_blocks"] = True
    if t.async_output:
        out["async_output"] = True
    if t.padded:
        out["padded"] = True
    return out


def engine_facts(path: Path) -> dict[str, dict]:
    """What the measurement file says of each engine's scheduling (its `engines:`): not fitted."""
    raw = yaml.safe_load(path.read_text()) or {}
    return {k: dict(v) for k, v in (raw.get("engines") or {}).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", type=Path, default=MEASUREMENTS)
    ap.add_argument("--out", type=Path, default=TERMS_FILE, help="the terms file to write")
    ap.add_argument("--max-evals", type=int, default=120, help="per block of parameters and round")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args(argv)
    measurements = load_measurements(args.measurements)
    fit = Fit(measurements, engine_facts(args.measurements))
    t0 = time.monotonic()
    values, objective = fit_terms(fit, args.max_evals)
    print(f"fit over {len(fit.fit)} configurations in {time.monotonic() - t0:.0f} s ({fit.evaluations} evaluations)")
    for name, value in values.items():
        print(f"  {name:36s} {value:.4g}")
    document = terms_document(fit, values, objective, measurements)
    for group, e in document["fit"]["fit_set_error"].items():
        print(f"  fit set {group:10s} median {e['median']:.1%}  worst {e['worst']:.1%}  ({e['figures']} figures)")
    if not args.dry_run:
        header = ("# Engine terms of the GPU presets (worker/gpu_presets.py), written by benchmarks/gpu_fit.py from\n"
                  "# benchmarks/published/measurements.yaml's fit set; do not edit by hand.\n")
        args.out.write_text(header + yaml.safe_dump(document, sort_keys=False))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
