# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # batchlab from a notebook
#
# A sweep of two strategies at two rates on the sim backend (no model, seconds a point), read into pandas and
# plotted inline; each strategy's capacity searched in virtual time; a strategy written here, run live (the
# scheduler's process gets the class by value: a notebook's classes cannot be imported by name). Open it
# with Jupyter (`jupytext --to notebook examples/notebook.py`, or as a script: `python examples/notebook.py`;
# the `if __name__ == "__main__":` guards are for that case). The cells that call batchlab are README's
# "From Python" scripts, as they are written there.

# %%
# A sweep of 2 strategies × 2 rates on the sim backend, read into pandas
from batchlab import api

PLAN = {"base": {"backend": "sim", "dataset": "synthetic", "duration_s": 2, "max_new_tokens": 32},
        "grid": {"strategies": ["naive", "dynamic"], "rates": [4, 8]}}

if __name__ == "__main__":  # runs start their processes with spawn: keep the guard (a notebook needs none; without
    # it each spawned process stops with one line naming the guard, docs/processes.md)
    result = api.sweep(PLAN, "results/py")               # SweepResult: the folder, a record per point
    points = result.points()                             # one row per point: label, rate, ..., its figures
    print(points[["label", "rate", "throughput_tok_s", "ttft_p50", "e2e_p99"]])
    requests = result.requests()                         # every request, its run's label, strategy, rate, repeat
    print(requests.groupby(["label", "rate"], observed=True)["ttft"].median())

# %%
# One curve, inline: TTFT p50 against the served output tokens/s, a line per strategy (one Figure)
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 4))
for label, curve in points.groupby("label"):
    curve = curve.sort_values("rate")
    ax.plot(curve["throughput_tok_s"], curve["ttft_p50"], marker="o", label=label)
ax.set_xlabel("output tokens/s")
ax.set_ylabel("TTFT p50 (s)")
ax.legend()
plt.show()

# %%
# The same runs through DuckDB: every request's row with its run's identity columns
result.sql("SELECT label, rate, count(*) AS requests, median(e2e) AS e2e_p50 FROM requests GROUP BY ALL ORDER BY ALL")

# %%
# Each strategy's capacity, simulated (virtual time: a second, no process)
from batchlab import api

PLAN = {"base": {"backend": "sim", "dataset": "synthetic", "max_new_tokens": 32},
        "grid": {"strategies": ["naive", "dynamic"], "rates": [4, 8]}}

if __name__ == "__main__":
    capacity = api.capacity(PLAN, simulated=True, preset="cpu-tiny-mistral", search_duration_s=10)
    for label, c in capacity.strategies.items():
        print(f"{label}: capacity {c.estimate_req_s:.2f} req/s, saturated {c.saturated_req_s:.2f} req/s")

# %%
# A run with a strategy written here: fixed batches of its own size (4 unless the run sets max_batch_size)
from dataclasses import dataclass

from batchlab import api
from batchlab.api.strategy import Decision, Policy


@dataclass
class Params:
    max_batch_size: int = 4  # this strategy's own default: a run's max_batch_size replaces it only when given


class FixedBatch(Policy):
    """Launch the oldest requests once max_batch_size of them wait; flush the rest when the traffic ends."""

    Params = Params

    def decide(self, queue, now, cap, end_of_stream):
        n = min(self.params.max_batch_size, len(queue), cap.free_slots)
        full = n == self.params.max_batch_size
        return Decision(n, "full") if full or (n and end_of_stream) else Decision()


if __name__ == "__main__":
    settings = {"backend": "sim", "dataset": "synthetic", "rate": 20, "duration_s": 2, "max_new_tokens": 32}
    summary = api.run(settings, strategy=FixedBatch)      # a RunResult: the Summary, and its tables
    print(summary.finished, "finished; TTFT p50", summary.ttft.p50, "s")
    print(summary.batches()["size"].value_counts())      # batches of 4 (the last may be smaller)

# %%
# The sweep's report (REPORT.md, REPORT.html, its PNGs) leaves the notebook's plotting alone: this shows inline
import matplotlib

report = api.report(result.out)
print(report.path, *report.headlines, sep="\n")
print("backend:", matplotlib.get_backend())
fig, ax = plt.subplots(figsize=(6, 3))
ax.hist(summary.batches()["size"], bins=range(1, 7), align="left", rwidth=0.8)
ax.set_xlabel("batch size (FixedBatch)")
plt.show()
