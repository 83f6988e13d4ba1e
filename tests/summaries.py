"""Summaries for the tests that need only a few figures: every required one zero unless given."""
from batchlab.collector.summary import Summary

ZERO = {"scheduled": 0, "submitted": 0, "finished": 0, "failed": 0, "failure_reasons": {}, "output_tokens": 0,
        "window_s": 0.0, "throughput_tok_s": 0.0, "requests_per_s": 0.0, "ttft": {}, "tpot": {}, "itl": {},
        "e2e": {}, "queue_wait": {}, "settings": {}}


def make_summary(**fields) -> Summary:
    """A Summary with these fields, the other required ones zero (or empty)."""
    return Summary.model_validate(ZERO | fields)
