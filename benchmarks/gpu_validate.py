"""Replay every published GPU measurement in the simulator and print, per source, the published figure, the
prediction and the error; then the median and worst |error| over the held-back check set (and the fit set),
for throughput, TPOT/ITL and TTFT separately.

    python benchmarks/gpu_validate.py                      # the table and the summary (about 5 s)
    python benchmarks/gpu_validate.py --json out.json      # also the rows and the summary as JSON
    python benchmarks/gpu_validate.py --markdown           # the table as markdown (docs/simulator.md's)

Each configuration (benchmarks/published/measurements.yaml) plays the step model of its GPU, model and engine
terms (worker/presets/gpu/engines.yaml, fitted by benchmarks/gpu_fit.py on the fit set only) through
simulator.published.replay: virtual time, the live scheduler's vLLM policy, all-at-once, closed-loop or Poisson
arrivals as the source ran them. Exit status 0 when the check set meets the bar (--median, --worst), 1 when not.
"""
import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchlab.simulator.measurements import load_measurements  # noqa: E402
from batchlab.simulator.published import (GroupError, PublishedPrediction, group_errors, meets,  # noqa: E402
                                          predict, rows_of)
from batchlab.worker.gpu_presets import TERMS_FILE, load_terms  # noqa: E402

MEASUREMENTS = ROOT / "benchmarks" / "published" / "measurements.yaml"
MEDIAN_BAR, WORST_BAR = 0.10, 0.25  # the bar on the check set, per group
LABELS = {"throughput": "throughput", "tpot": "TPOT/ITL", "ttft": "TTFT"}
UNITS = {"throughput_req_s": ("req/s", 1), "throughput_out_tok_s": ("tok/s", 1), "tpot_median_s": ("ms", 1e3),
         "tpot_mean_s": ("ms", 1e3), "batch_latency_s": ("ms", 1e3), "ttft_median_s": ("ms", 1e3),
         "ttft_mean_s": ("ms", 1e3)}


def validate(measurements_path: Path = MEASUREMENTS, terms_path: Path = TERMS_FILE) -> list[PublishedPrediction]:
    """Every published figure beside its prediction."""
    terms = load_terms(terms_path)
    rows = []
    for m in load_measurements(measurements_path):
        rows += rows_of(m, predict(m, terms))
    return rows


def value(metric: str, v: float) -> str:
    """A figure in its display unit."""
    unit, scale = UNITS[metric]
    return f"{v * scale:.4g} {unit}"


def table_lines(rows: list[PublishedPrediction], markdown: bool) -> list[str]:
    """The per-source table (a figure that is not scored is marked with *)."""
    head = ["source", "configuration", "split", "metric", "published", "predicted", "error"]
    cells = [[r.source.split(",")[0], r.measurement, r.split, r.metric + ("" if r.scored else " *"),
              value(r.metric, r.published), value(r.metric, r.predicted), f"{r.error:+.1%}"] for r in rows]
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in cells]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *cells)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    lines, last = [fmt.format(*head)], None
    for c in cells:
        if c[0] != last:
            lines.append("")
            last = c[0]
        lines.append(fmt.format(*c))
    return lines


def summary_lines(rows: list[PublishedPrediction]) -> list[str]:
    """Median and worst |error| per group, check set then fit set, and the bar."""
    lines = []
    for split, title in (("check", "held-back check set"), ("fit", "fit set")):
        n = len({r.measurement for r in rows if r.split == split})
        gpus = sorted({r.gpu for r in rows if r.split == split})
        lines.append(f"{title}: {n} configurations on {len(gpus)} GPU types ({', '.join(gpus)})")
        for e in group_errors(rows, split):
            lines.append(f"  {LABELS[e.group]:10s} median |error| {e.median:6.1%}  worst {e.worst:6.1%}  "
                         f"({e.count} figures; worst: {e.worst_row})")
    check = group_errors(rows, "check")
    verdict = "meets" if meets(check, MEDIAN_BAR, WORST_BAR) else "does NOT meet"
    lines.append(f"check set {verdict} the bar: median <= {MEDIAN_BAR:.0%} and worst <= {WORST_BAR:.0%} "
                 f"in every group")
    return lines


def as_json(rows: list[PublishedPrediction]) -> dict:
    """Rows and per-split group errors as plain JSON."""
    def groups(split: str) -> list[dict]:
        return [vars(e) if not hasattr(e, "__slots__") else {s: getattr(e, s) for s in GroupError.__slots__}
                for e in group_errors(rows, split)]
    return {"rows": [{s: getattr(r, s) for s in PublishedPrediction.__slots__} | {"error": r.error, "group": r.group}
                     for r in rows],
            "check": groups("check"), "fit": groups("fit"),
            "meets_bar": meets(group_errors(rows, "check"), MEDIAN_BAR, WORST_BAR),
            "bar": {"median": MEDIAN_BAR, "worst": WORST_BAR}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", type=Path, default=MEASUREMENTS)
    ap.add_argument("--terms", type=Path, default=TERMS_FILE, help="engine terms (benchmarks/gpu_fit.py's output)")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary here")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args(argv)
    start = time.monotonic()
    rows = validate(args.measurements, args.terms)
    print("\n".join(table_lines(rows, args.markdown)))
    print("\n* published, not scored (one figure per group per configuration is scored)\n")
    print("\n".join(summary_lines(rows)))
    print(f"({len(rows)} figures replayed in {time.monotonic() - start:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(as_json(rows), indent=2))
    return 0 if meets(group_errors(rows, "check"), MEDIAN_BAR, WORST_BAR) else 1


if __name__ == "__main__":
    raise SystemExit(main())
