"""How a run's load stops and is paced, beside the rate: a count-only stop's duration, and the closed
loop's terms (--concurrency). Part of protocol.settings, kept apart to keep that file short."""
import math

DEFAULT_DURATION_S = 10.0  # RunConfig's duration_s (protocol.setting_groups takes it from here)
CLOSED_LOOP_COUNT_DURATION_S = 3600.0  # closed loop, --num-requests without --duration: the count alone stops it


CLOSED_LOOP_CONFLICT = ("--concurrency N (closed loop: each client sends when its last request ended) does not go "
                        "with --rate or --arrival (open loop): give one or the other")


def closed_loop_terms(merged: dict) -> bool:
    """Closed loop decides send times online, so a rate or an arrival process beside it is refused (False);
    else the merged settings get rate inf (no planned times: every request is ready at t = 0, the clients
    take them in order) and, for --num-requests alone, a duration that leaves the count to stop the run."""
    rate, arrival = merged.get("rate"), merged.get("arrival", "poisson")
    rate_inf = rate is None or str(rate).strip().lower() in ("inf", "+inf", "infinity")
    if not rate_inf or arrival != "poisson":
        return False
    merged["rate"] = math.inf
    if merged.get("num_requests") and "duration_s" not in merged:
        merged["duration_s"] = CLOSED_LOOP_COUNT_DURATION_S
    return True


def count_duration_s(num_requests: object, rate: object, burstiness: object) -> float:
    """A duration that holds `num_requests` arrivals at `rate` all but surely (their mean time plus 8
    standard deviations of a gamma process, s): --num-requests without --duration is a count-only stop.
    rate inf (all at t = 0) or a rate that is no number: the default duration (DEFAULT_DURATION_S)."""
    try:
        n, rate_f, shape = float(num_requests), float(rate), min(float(burstiness), 1.0)
        if not (rate_f > 0 and math.isfinite(rate_f) and n > 0 and shape > 0):
            return DEFAULT_DURATION_S
        return float(f"{(n + 8 * math.sqrt(n / shape) + 1) / rate_f:.4g}")
    except (TypeError, ValueError):
        return DEFAULT_DURATION_S


