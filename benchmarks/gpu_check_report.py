"""benchmarks/gpu_check.py's report: OUT/GPU_CHECK.md (what ran, the calibrations, the live and simulated
points, the error split, each phase's time) and OUT/gpu_check.json (the same facts, for tools)."""
import json
from pathlib import Path


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def _errors(e: dict) -> str:
    return ", ".join(f"{k} mean {_pct(v['mean_abs'])} worst {_pct(v['worst_abs'])}" for k, v in (e or {}).items()) or "-"


def _points(rows: list[dict] | None) -> list[str]:
    if not rows:
        return ["(none)"]
    lines = ["| strategy | rate | finished | tok/s | TTFT p50 s | E2E p50 s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['rate']:g} | {r['finished']}/{r['submitted']} | {_num(r['throughput_tok_s'])} | "
              f"{_num(r['ttft_p50'])} | {_num(r['e2e_p50'])} |" for r in rows]
    return lines


def render(facts: dict) -> str:
    """The report's markdown."""
    env = facts["environment"]
    lines = ["# GPU check", "", f"Python {env['python']}, torch {env.get('torch')}, GPU {env.get('gpu')}, "
             f"device {env['device']}; missing modules: "
             f"{', '.join(m for m, ok in env['modules'].items() if not ok) or 'none'}.", "", "## Phases", "",
             "| phase | status | s | note |", "|---|---|---|---|"]
    lines += [f"| {p['phase']} | {p['status']} | {p.get('seconds', '-')} | {p.get('why', '')} |" for p in facts["phases"]]
    lines += ["", "## Calibration (in-process grid)", "", "| model kind | fit error | held-out error | unsettled |",
              "|---|---|---|---|"]
    lines += [f"| {name} | {_errors(c['fit_error'])} | {_errors(c['held_out_error'])} | {c['unsettled_samples']} |"
              for name, c in facts["calibrations"].items()]
    lines += ["", "## Live sweep (short points)", "", *_points(facts.get("live")), "",
              "## Simulated (calibrated presets)", "", *_points(facts.get("simulated"))]
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


def write_report(out: Path, facts: dict) -> None:
    """OUT/GPU_CHECK.md and OUT/gpu_check.json."""
    (out / "gpu_check.json").write_text(json.dumps(facts, indent=2, default=str))
    (out / "GPU_CHECK.md").write_text(render(facts))
