"""What `batchlab run` prints at its end: the figures a user came for, as `vllm bench serve` does, and
a warning line when the run was overloaded or the harness itself lagged."""
from rich.console import Console
from rich.table import Table

from batchlab.collector.summary import Latency, Summary
from batchlab.protocol.status import FailureReason
from batchlab.stats.interference import DISTURBED_CORES, read as read_interference

OVERLOAD_SERVED_SHARE = 0.9  # served rate under this share of the offered rate: the worker did not keep up
SEND_LAG_WARN_S = 1e-3  # traffic sent its p99 request this late: arrival times are not what was planned
HARNESS_CPU_WARN = 0.8  # the harness's own CPU (collector, scheduler, a sim/echo worker) near one core
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def offered_rate(summary: Summary) -> float | None:
    """Requests the schedule offered per second of planned traffic (None when unknown, or when every
    request came at once: --rate inf is a throughput test, not a rate). A run stopped by its request
    count offered them over its last arrival's time, not over the duration cap."""
    settings = summary.settings
    if str(settings.get("rate")) in ("inf", "Infinity"):
        return None
    duration_s, scheduled = settings.get("duration_s") or 0, summary.scheduled
    last_s = summary.harness_lag.get("last_arrival_s")
    if settings.get("num_requests") and scheduled >= settings["num_requests"] and last_s and scheduled > 1:
        duration_s = last_s * scheduled / (scheduled - 1)  # n arrivals span n − 1 gaps
    return scheduled / duration_s if duration_s and scheduled else None


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:,.1f}"


def table(summary: Summary) -> Table:
    """The end-of-run table: counts and rates, then latency percentiles (ms)."""
    t = Table(title="Result", show_header=False, title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    offered = offered_rate(summary)
    t.add_row("requests finished / scheduled", f"{summary.finished} / {summary.scheduled}")
    for reason, count in summary.failure_reasons.items():
        t.add_row(f"  failed: {reason.splitlines()[0][:60]}", str(count))
    if clients := summary.settings.get("concurrency"):
        think_ms = summary.settings.get("think_time_ms") or 0
        t.add_row("closed loop (clients)", f"{clients}" + (f", think {think_ms:g} ms" if think_ms else ""))
    else:
        t.add_row("offered rate (req/s)", "–" if offered is None else f"{offered:.2f}")
    t.add_row("served rate (req/s)", f"{summary.requests_per_s:.2f}")
    t.add_row("output throughput (tok/s)", f"{summary.throughput_tok_s:,.1f}")
    if good := summary.goodput:
        t.add_row("goodput (SLOs met)", "–" if good.fraction is None else
                  f"{good.fraction:.1%} ({good.met} of {good.submitted})")
    for key, name in LATENCIES:
        figures: Latency = getattr(summary, key)
        t.add_row(f"{name} p50 / p90 / p99 (ms)", " / ".join(_ms(v) for v in (figures.p50, figures.p90, figures.p99)))
    if beside := read_interference(summary.interference):
        t.add_row("other work on this machine (cores)", f"{beside.other_cores:.2f} of {beside.cores}"
                  + (" ⚠" if beside.disturbed else ""))
    return t


def point_line(summary: Summary) -> str:
    """A finished sweep point's figures on one line, from the same summary as the end-of-run table."""
    beside = read_interference(summary.interference)
    busy = "" if beside is None else f"; other work {beside.other_cores:.2f} cores" + (" ⚠" if beside.disturbed else "")
    return (f"served {summary.requests_per_s:.2f} req/s, {summary.throughput_tok_s:,.1f} tok/s, "
            f"TTFT p50 {_ms(summary.ttft.p50)} ms, E2E p50 {_ms(summary.e2e.p50)} ms, "
            f"{summary.finished}/{summary.scheduled} finished{busy}")


def warnings(summary: Summary) -> list[str]:
    """One line per reason the figures mislead: overload, a lagging sender, a busy harness."""
    out = []
    offered, served, reasons = offered_rate(summary), summary.requests_per_s, summary.failure_reasons
    if offered and served < OVERLOAD_SERVED_SHARE * offered:
        out.append(f"overloaded: served {served:.2f} of the {offered:.2f} req/s offered; latencies grow with "
                   "the run's length here, and are not a steady state")
    elif any(FailureReason.QUEUE_FULL in r for r in reasons):
        out.append("overloaded: requests were rejected because the queue was full")
    lag = summary.harness_lag.get("p99")
    closed = bool(summary.settings.get("concurrency"))  # no planned times to lag behind
    if lag is not None and lag > SEND_LAG_WARN_S and not closed:
        out.append(f"the traffic sender lagged: p99 {lag * 1e3:.1f} ms behind the planned arrival times")
    beside = read_interference(summary.interference)
    if beside is not None and beside.disturbed:
        out.append(f"the machine was busy: {beside.text()} while this run ran (more than {DISTURBED_CORES:g} "
                   "of a core): its throughput and latencies may be bent by that work, not only the strategy")
    share = harness_cpu_share(summary)
    if share is not None and share > HARNESS_CPU_WARN:
        out.append(f"the harness used {share:.0%} of a core: its own CPU may have shaped these figures")
    return out


def harness_cpu_share(summary: Summary) -> float | None:
    """The harness's CPU seconds per second of the run's window (None when unknown)."""
    cpu, window_s = summary.harness_cpu.get("cpu_s") or {}, summary.window_s
    model_worker = summary.settings.get("backend") not in ("sim", "echo")
    roles = {k: v for k, v in cpu.items() if not (model_worker and k.startswith("worker"))}
    return sum(roles.values()) / window_s if window_s > 0 and roles else None


def show(summary: Summary, out: str, console: Console | None = None) -> None:
    """Print the table, the warnings (stderr) and where the files are."""
    console = console or Console()
    console.print(table(summary))
    err = Console(stderr=True)
    for line in warnings(summary):
        err.print(f"[yellow]warning:[/] {line}")
    clients = summary.settings.get("concurrency")
    load = f" ({clients} closed-loop client{'s' * (clients != 1)})" if clients else ""
    console.print(f"results in {out}: {summary.finished} finished, {summary.failed} failed{load}")
