"""A run's requests from a trace: the trace's arrival times (arrival "trace") or generated ones, and
the trace's input and output lengths, with prompts of exactly those lengths."""
import numpy as np

from batchlab.traffic.arrivals import arrival_offsets, trace_window
from batchlab.traffic.config import TRACE_ARRIVAL, TrafficConfig
from batchlab.traffic.datasets import load_sharegpt
from batchlab.traffic.prompts import Prompts, Tokenizer, exact_length_prompts
from batchlab.traffic.traces import Trace, load_trace


def trace_requests(cfg: TrafficConfig, tokenizer: Tokenizer | None) -> tuple[np.ndarray, Prompts, dict]:
    """(arrival offsets, prompts, notes) for a trace dataset; offsets from default_rng([seed, 0]) when
    generated, prompt ids from default_rng([seed, 1]), as for every dataset.

    arrival "trace": the window arrivals.trace_window picks. Another arrival kind: its generated times,
    and request k gets the lengths of the trace's k-th request from trace_start_s (cycling at the end).
    """
    trace = load_trace(cfg.dataset)
    if cfg.arrival == TRACE_ARRIVAL:
        offsets, picked, notes = _windowed(trace, cfg)
    else:
        offsets = arrival_offsets(cfg.arrival, cfg.rate, cfg.duration_s, np.random.default_rng([cfg.seed, 0]),
                                  burstiness=cfg.burstiness)
        picked, notes = _lengths_only(trace, cfg, len(offsets))
    pairs = load_sharegpt() if tokenizer is not None else None
    prompts = exact_length_prompts(trace.input_lens[picked], trace.output_lens[picked], cfg, pairs, tokenizer,
                                   np.random.default_rng([cfg.seed, 1]))
    notes.update(trace_requests=len(picked), trace_skipped_rows=trace.skipped)
    return offsets, prompts, notes


def _windowed(trace: Trace, cfg: TrafficConfig) -> tuple[np.ndarray, np.ndarray, dict]:
    """The trace's own arrivals in the configured window (rescaled to cfg.rate unless it is 0)."""
    window = trace_window(trace.offsets_s, trace.span_s, cfg.trace_start_s, cfg.duration_s, cfg.rate)
    n = len(window.offsets_s)
    notes = {"trace_window_s": [float(window.start_s), float(window.end_s)], "trace_speedup": window.speedup,
             "trace_native_rate": n / (window.end_s - window.start_s)}
    return window.offsets_s, np.arange(window.first, window.first + n), notes


def _lengths_only(trace: Trace, cfg: TrafficConfig, n: int) -> tuple[np.ndarray, dict]:
    """Indices of the trace requests whose lengths `n` generated arrivals take."""
    if not cfg.trace_start_s < trace.span_s:
        raise ValueError(f"trace start {cfg.trace_start_s:g} s is past the trace's end ({trace.span_s:.0f} s)")
    first = int(np.searchsorted(trace.offsets_s, cfg.trace_start_s, side="left")) % trace.n_requests
    return (first + np.arange(n)) % trace.n_requests, {"trace_first_request": first}
