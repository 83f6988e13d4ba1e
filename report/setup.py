"""What the runs ran on: hardware, model, dtype, library versions and every setting."""
from batchlab.report.points import RunData
from batchlab.report.text import md_table

# per-point values, shown elsewhere
VOLATILE = ("out", "t0", "workers", "rate", "seed", "environment", "config_hash", "label", "repeat")


def recorded_environment(settings: dict) -> dict:
    """Where the run's model ran, as the run recorded it: the first worker's own environment (a remote
    worker reports its box's), else the scheduler's; {} for a run recorded before environments were."""
    return worker_facts(settings).get("environment") or settings.get("environment") or {}


def cpu_model(settings: dict) -> str:
    """The CPU's model name as the run recorded it (older runs: their `cpu` setting)."""
    env = recorded_environment(settings)
    return str(env.get("cpu") or settings.get("cpu") or "unknown CPU")


def worker_facts(settings: dict) -> dict:
    """The first worker's hello facts (backend, device, dtype, …) as the collector recorded them."""
    workers = settings.get("workers")
    if isinstance(workers, dict) and workers:
        first = next(iter(workers.values()))
        return first if isinstance(first, dict) else {}
    return {}


def gpu_name(settings: dict) -> str:
    """'NVIDIA H200' when a worker's device names a GPU, else ''."""
    device = str(worker_facts(settings).get("device", ""))
    if "(" in device and device.startswith("cuda"):
        return device.split("(", 1)[1].rstrip(")")
    return "GPU" if device.startswith("cuda") else ""


def hardware(settings: dict) -> str:
    """Where the numbers come from, for the one-line result."""
    if settings.get("backend") in ("sim", "echo"):
        return (f"the {settings.get('backend')} backend's {settings.get('preset')} step model "
                f"(host CPU {cpu_model(settings)})")
    gpu = gpu_name(settings)
    cores = settings.get("cpu_count")
    return gpu or f"{cpu_model(settings)} ({cores} CPU cores)"


def setup_lines(run: RunData) -> list[str]:
    """The setup section's bullet list, from one run's own records (never the reporting machine's)."""
    s, facts = run.settings, worker_facts(run.settings)
    env = recorded_environment(s)
    ram, cores = env.get("memory_bytes") or 0, env.get("cpu_count", s.get("cpu_count", "?"))
    libraries = env.get("libraries") or {}
    made_by = env.get("batchlab") or {}
    return [f"- CPU: {cpu_model(s)}, {cores} cores"
            + (f", {ram / 2**30:.1f} GiB RAM" if ram else "") + f" (host {env.get('host', s.get('host', '?'))})",
            f"- GPU: {gpu_name(s) or 'none'}",
            f"- model: {s.get('model')} (sim preset {s.get('preset')})" if s.get("backend") == "sim"
            else f"- model: {s.get('model')}",
            f"- dtype: {facts.get('dtype', s.get('dtype'))}",
            "- libraries: " + (", ".join(f"{k} {v}" for k, v in libraries.items()) or "not recorded by this run"),
            f"- batchlab {made_by.get('version', '?')} (commit {made_by.get('commit') or 'unknown'})"]


def prefix_cache_line(run: RunData) -> str:
    """What an engine's prefix cache did for this run ('' when it has none): a warm or long-running
    server that remembers an earlier run's prompts would make its TTFT look better than it is."""
    facts, summary = worker_facts(run.settings), run.summary
    if "prefix_caching" not in facts and "prefix_cache_reset" not in facts:
        return ""
    state = ("on" if facts.get("prefix_caching") else "off") if "prefix_caching" in facts else "server's"
    reset = ("emptied before every run" if facts.get("prefix_cache_reset_between_runs")
             else str(facts.get("prefix_cache_reset", "not reset")))
    stats = summary.prefix_cache or next((s.get("server_prefix_cache") for s in summary.worker_stats.values()
                                          if isinstance(s, dict) and s.get("server_prefix_cache")), None)
    rate = stats.get("hit_rate") if stats else None
    hits = f"; hit rate {rate:.1%} of prompt tokens at λ = {run.rate:g} req/s" if rate is not None else ""
    return f"- prefix cache ({run.label}): {state}, {reset}{hits}"


# traffic.prompts.PROMPT_SOURCES, restated: the collector does not import traffic
PROMPT_SOURCES = {
    "sharegpt": "whole prompts of a conversation file (text and its tokens)",
    "synthetic": "uniform random token ids, lengths from the synthetic length settings",
    "sharegpt-cut": "the trace's lengths; ShareGPT prompts' token ids joined and cut to each length",
    "synthetic-ids": "the trace's lengths; uniform random token ids",
}


def _trace_text(notes: dict) -> str:
    """What part of a trace a schedule replays ('' when it is not from a trace)."""
    parts = []
    if "trace_window_s" in notes:
        start_s, end_s = notes["trace_window_s"]
        parts.append(f"trace window [{start_s:g}, {end_s:g}) s at {notes.get('trace_speedup', 1.0):.3g}× its speed "
                     f"(its own rate there {notes.get('trace_native_rate', float('nan')):.3g} req/s)")
    if "trace_first_request" in notes:
        parts.append(f"trace lengths from its request {notes['trace_first_request']} on")
    if notes.get("trace_skipped_rows"):
        parts.append(f"{notes['trace_skipped_rows']} trace rows skipped (a zero length)")
    return "; ".join(parts)


def schedule_lines(runs: list[RunData]) -> list[str]:
    """Where the prompts came from, and per rate how many lengths were capped (from the summary's schedule,
    the first run at each rate that has it: every strategy replays the same schedule); [] without notes."""
    first: dict[float, RunData] = {}
    for run in sorted(runs, key=lambda r: r.repeat):
        if run.summary.schedule:
            first.setdefault(run.rate, run)
    sources = dict.fromkeys(str(r.summary.schedule.get("prompt_source", "")) for r in first.values())
    lines = [f"- prompts: {src} ({PROMPT_SOURCES.get(src, 'not described')})" for src in sources if src]
    for rate, run in sorted(first.items()):
        notes, s = run.summary.schedule, run.settings
        text = (f"- schedule at λ = {rate:g} req/s: {run.summary.scheduled} requests; capped: "
                f"{notes.get('capped_prompts', 0)} prompt lengths to max_prompt_len {s.get('max_prompt_len', '?')}, "
                f"{notes.get('capped_outputs', 0)} output lengths to max_new_tokens {s.get('max_new_tokens', '?')}")
        trace = _trace_text(notes)
        lines.append(text + (f"; {trace}" if trace else ""))
    return lines


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flat(key: str, value: object) -> list[tuple[str, object]]:
    """A setting as rows: a mapping (a worker's environment, its libraries) one row per entry, `key.sub`."""
    if isinstance(value, dict) and value:
        return [row for sub, v in value.items() for row in _flat(f"{key}.{sub}", v)]
    return [(key, value)]


def _settings(run: RunData) -> dict:
    """One run's settings and its first worker's facts, flattened to one value per row."""
    rows = [row for k, v in run.settings.items() if k not in VOLATILE for row in _flat(k, v)]
    rows += _flat("worker", worker_facts(run.settings))
    return {k: _cell(v) for k, v in rows if k != "worker"}


def knob_table(runs_by_label: dict[str, RunData]) -> list[str]:
    """Every setting, one row each (values from each strategy's first completed run): those every strategy
    shares once, with one value, then those that differ, one column per strategy."""
    labels = list(runs_by_label)
    values = {lb: _settings(run) for lb, run in runs_by_label.items()}
    keys = list(dict.fromkeys(k for v in values.values() for k in v))
    same = [k for k in keys if len({values[lb].get(k, "") for lb in labels}) == 1]
    differ = [k for k in keys if k not in same]
    shared = "value" if len(labels) == 1 else "value (every strategy)"
    out = md_table(["setting", shared], [[k, values[labels[0]][k]] for k in same])
    if differ:
        out += ["", "Settings that differ between strategies:", ""]
        out += md_table(["setting", *labels], [[k, *(values[lb].get(k, "") for lb in labels)] for k in differ])
    return out
