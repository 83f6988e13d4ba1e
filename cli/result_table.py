"""What `batchlab run` prints at its end: the figures a user came for, as `vllm bench serve` does, and
a warning line when the run was overloaded or the harness itself lagged."""
from rich.console import Console
from rich.table import Table

OVERLOAD_SERVED_SHARE = 0.9  # served rate under this share of the offered rate: the worker did not keep up
SEND_LAG_WARN_S = 1e-3  # traffic sent its p99 request this late: arrival times are not what was planned
HARNESS_CPU_WARN = 0.8  # the harness's own CPU (collector, scheduler, a sim/echo worker) near one core
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def offered_rate(summary: dict) -> float | None:
    """Requests the schedule offered per second of planned traffic (None when unknown, or when every
    request came at once: --rate inf is a throughput test, not a rate). A run stopped by its request
    count offered them over its last arrival's time, not over the duration cap."""
    settings = summary.get("settings") or {}
    if str(settings.get("rate")) in ("inf", "Infinity"):
        return None
    duration_s, scheduled = settings.get("duration_s") or 0, summary.get("scheduled") or 0
    last_s = (summary.get("harness_lag") or {}).get("last_arrival_s")
    if settings.get("num_requests") and scheduled >= settings["num_requests"] and last_s and scheduled > 1:
        duration_s = last_s * scheduled / (scheduled - 1)  # n arrivals span n − 1 gaps
    return scheduled / duration_s if duration_s and scheduled else None


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:,.1f}"


def table(summary: dict) -> Table:
    """The end-of-run table: counts and rates, then latency percentiles (ms)."""
    t = Table(title="Result", show_header=False, title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    offered = offered_rate(summary)
    t.add_row("requests finished / scheduled", f"{summary.get('finished', 0)} / {summary.get('scheduled', 0)}")
    for reason, count in (summary.get("failure_reasons") or {}).items():
        t.add_row(f"  failed: {reason.splitlines()[0][:60]}", str(count))
    if clients := (summary.get("settings") or {}).get("concurrency"):
        think_ms = summary["settings"].get("think_time_ms") or 0
        t.add_row("closed loop (clients)", f"{clients}" + (f", think {think_ms:g} ms" if think_ms else ""))
    else:
        t.add_row("offered rate (req/s)", "–" if offered is None else f"{offered:.2f}")
    t.add_row("served rate (req/s)", f"{summary.get('requests_per_s', 0.0):.2f}")
    t.add_row("output throughput (tok/s)", f"{summary.get('throughput_tok_s', 0.0):,.1f}")
    if goodput := summary.get("goodput"):
        fraction = goodput.get("fraction")
        t.add_row("goodput (SLOs met)", "–" if fraction is None else
                  f"{fraction:.1%} ({goodput.get('met')} of {goodput.get('submitted')})")
    for key, name in LATENCIES:
        figures = summary.get(key) or {}
        t.add_row(f"{name} p50 / p90 / p99 (ms)",
                  " / ".join(_ms(figures.get(p)) for p in ("p50", "p90", "p99")))
    return t


def warnings(summary: dict) -> list[str]:
    """One line per reason the figures mislead: overload, a lagging sender, a busy harness."""
    out = []
    offered, served = offered_rate(summary), summary.get("requests_per_s") or 0.0
    reasons = summary.get("failure_reasons") or {}
    if offered and served < OVERLOAD_SERVED_SHARE * offered:
        out.append(f"overloaded: served {served:.2f} of the {offered:.2f} req/s offered; latencies grow with "
                   "the run's length here, and are not a steady state")
    elif any("queue full" in r for r in reasons):
        out.append("overloaded: requests were rejected because the queue was full")
    lag = (summary.get("harness_lag") or {}).get("p99")
    closed = bool((summary.get("settings") or {}).get("concurrency"))  # no planned times to lag behind
    if lag is not None and lag > SEND_LAG_WARN_S and not closed:
        out.append(f"the traffic sender lagged: p99 {lag * 1e3:.1f} ms behind the planned arrival times")
    share = harness_cpu_share(summary)
    if share is not None and share > HARNESS_CPU_WARN:
        out.append(f"the harness used {share:.0%} of a core: its own CPU may have shaped these figures")
    return out


def harness_cpu_share(summary: dict) -> float | None:
    """The harness's CPU seconds per second of the run's window (None when unknown)."""
    cpu = ((summary.get("harness_cpu") or {}).get("cpu_s") or {})
    window_s = summary.get("window_s") or 0
    model_worker = (summary.get("settings") or {}).get("backend") not in ("sim", "echo")
    roles = {k: v for k, v in cpu.items() if not (model_worker and k.startswith("worker"))}
    return sum(roles.values()) / window_s if window_s > 0 and roles else None


def show(summary: dict, out: str, console: Console | None = None) -> None:
    """Print the table, the warnings (stderr) and where the files are."""
    console = console or Console()
    console.print(table(summary))
    err = Console(stderr=True)
    for line in warnings(summary):
        err.print(f"[yellow]warning:[/] {line}")
    clients = (summary.get("settings") or {}).get("concurrency")
    load = f" ({clients} closed-loop client{'s' * (clients != 1)})" if clients else ""
    console.print(f"results in {out}: {summary.get('finished', 0)} finished, {summary.get('failed', 0)} failed{load}")
