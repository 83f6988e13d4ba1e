"""report.stats: a continuous request's inter-token gaps split by whether the step that produced
the later token carried prompt tokens (other requests' prefill)."""
import pandas as pd
import pytest

from batchlab.report import stats
from batchlab.report.tokens import flags_for, frame_digest


def split(finished: pd.DataFrame, tokens: pd.DataFrame, steps: pd.DataFrame) -> dict | None:
    """stats.split over one run: its tokens' digest with its steps' flags."""
    return stats.split([finished], [frame_digest(tokens, flags_for(finished, steps))], steps)


def steps(*rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["worker", "start_time", "end_time", "prefill_tokens"])


def tokens(**times) -> pd.DataFrame:
    return pd.DataFrame([(int(rid[1:]), i, t) for rid, ts in times.items() for i, t in enumerate(ts)],
                        columns=["request_id", "token_index", "time"])


FINISHED = pd.DataFrame({"request_id": [1, 2], "worker": ["w0", "w0"], "output_len": [4, 2]})
STEPS = steps(("w0", 0.00, 0.10, 10),  # r1 prefilled, its first token
              ("w0", 0.10, 0.12, 0),   # r1 decodes
              ("w0", 0.12, 0.20, 20),  # r2 joins: r1's gap holds r2's prefill; r2's first token
              ("w0", 0.20, 0.22, 0))   # both decode


def test_gaps_are_split_by_the_step_that_made_the_later_token():
    got = split(FINISHED, tokens(r1=[0.09, 0.11, 0.19, 0.21], r2=[0.19, 0.21]), STEPS)
    assert got["chunk_share"] == pytest.approx(1 / 4)  # r1: 0.02, 0.08 (chunk), 0.02; r2: 0.02
    assert got["chunk_gap_mean"] == pytest.approx(0.08) and got["plain_gap_mean"] == pytest.approx(0.02)
    assert got["decode_only_tpot"]["p50"] == pytest.approx(0.02)


def test_a_token_no_step_holds_is_left_out_and_other_workers_steps_do_not_count():
    other = pd.concat([STEPS, steps(("w1", 0.195, 0.25, 50))], ignore_index=True)  # another worker's chunk
    got = split(FINISHED, tokens(r1=[0.09, 0.11, 0.19, 0.21, 0.5], r2=[0.19, 0.21]), other)
    assert got["chunk_share"] == pytest.approx(1 / 4)  # the token at 0.5 lies in no step: its gap is not counted


def test_runs_whose_steps_carry_no_prompt_tokens_give_none():
    assert split(FINISHED, tokens(r1=[0.1, 0.2, 0.3, 0.4], r2=[0.1, 0.2]), STEPS.assign(prefill_tokens=0)) is None
    assert split(FINISHED, tokens(r1=[0.1, 0.2, 0.3, 0.4], r2=[0.1, 0.2]), pd.DataFrame()) is None
