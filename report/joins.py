"""How much of a continuous batch's TPOT is other requests' prefill.

A static batch prefills once, before its first token, so its requests' TPOT holds decode steps only. In a
continuous batch a request that joins is prefilled inside the running rows' steps (whole, or in chunks within
the step's token budget), so the running rows' TPOT also holds the joiners' prefill: on a device where a step
costs what its tokens cost (a CPU), that is the price of the joiner's early first token, not slowness per
token. This splits each finished request's inter-token gaps by the step that produced the later token: one
that carried prompt tokens (`steps.parquet` prefill_tokens > 0) or one that decoded only. Measured, not
modelled: no step time is estimated. Runs whose steps record no prompt tokens (static batches; the vLLM
backend, whose steps do not report them) give None.
"""
import numpy as np
import pandas as pd

from batchlab.collector.metrics import percentiles


def _carried(tokens: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """Whether the step that produced each token (its worker's step whose span holds the token's time)
    carried prompt tokens; NA where no step holds it."""
    carried = pd.Series(pd.NA, index=tokens.index, dtype="boolean")
    for worker, own in steps.groupby("worker"):
        own = own.sort_values("start_time")
        mine = (tokens["worker"] == worker).to_numpy()
        times = tokens["time"].to_numpy()[mine]
        i = np.searchsorted(own["start_time"].to_numpy(), times, side="right") - 1
        j = np.clip(i, 0, None)
        flags = pd.array(own["prefill_tokens"].to_numpy()[j] > 0, dtype="boolean")
        flags[~((i >= 0) & (times <= own["end_time"].to_numpy()[j]))] = pd.NA
        carried.loc[mine] = flags
    return carried


def split(finished: pd.DataFrame, tokens: pd.DataFrame, steps: pd.DataFrame) -> dict | None:
    """For finished requests of more than one token: TPOT over decode-only gaps (per request, then
    percentiles), the share of gaps that ended in a step carrying prompt tokens and both kinds' mean gap (s)."""
    if ("worker" not in finished or steps.empty or "prefill_tokens" not in steps
            or not (steps["prefill_tokens"] > 0).any()):
        return None
    multi = finished.loc[finished["output_len"] > 1, ["request_id", "worker"]]
    tok = tokens.merge(multi, on="request_id").sort_values(["request_id", "token_index"], ignore_index=True)
    tok["carried"] = _carried(tok, steps)
    tok["gap"] = tok.groupby("request_id")["time"].diff()
    gaps = tok[tok["gap"].notna() & tok["carried"].notna()]
    if gaps.empty:
        return None
    chunk, plain = gaps[gaps["carried"].astype(bool)], gaps[~gaps["carried"].astype(bool)]
    return {"decode_only_tpot": percentiles(plain.groupby("request_id")["gap"].mean()),
            "chunk_share": len(chunk) / len(gaps),
            "chunk_gap_mean": float(chunk["gap"].mean()) if len(chunk) else None,
            "plain_gap_mean": float(plain["gap"].mean()) if len(plain) else None}
