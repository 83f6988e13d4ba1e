"""examples/notebook.py executed as a notebook, in a Jupyter kernel (where __main__ is no importable module): a
live sweep read into pandas and DuckDB, one curve plotted inline, each strategy's capacity simulated, a strategy
class written in the notebook run live with its own Params default, and a report that leaves the inline backend
alone. README's "From Python" scripts are the notebook's cells, as written."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from batchlab import api

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "notebook.py"
README = (ROOT / "README.md").read_text()


def readme_scripts() -> list[str]:
    """README's "From Python" code blocks, in order."""
    section = README[README.index("## From Python"):README.index("The functions (`run`")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_scripts_are_the_notebooks_cells_as_written():
    cells = [c.strip() for c in NOTEBOOK.read_text().split("# %%")]
    scripts = readme_scripts()
    assert len(scripts) == 3 and all(s.strip() in cells for s in scripts)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook run once as a person runs it, `jupyter nbconvert --to notebook --execute` in a python3
    kernel, in a folder of its own: (its cells, that folder)."""
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbconvert")
    work = tmp_path_factory.mktemp("notebook")
    jupytext.write(jupytext.read(NOTEBOOK), work / "notebook.ipynb")
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "--ExecutePreprocessor.timeout=900", "--ExecutePreprocessor.kernel_name=python3",
                           "--output", "executed.ipynb", "notebook.ipynb"], cwd=work, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    notebook = nbformat.read(work / "executed.ipynb", as_version=4)
    return [c for c in notebook.cells if c.cell_type == "code"], work


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.outputs)


@pytest.mark.slow
def test_the_notebook_sweeps_plots_inline_and_runs_a_strategy_it_defines(executed):
    cells, work = executed
    sweep, plot, sql, capacity, strategy, report = cells
    index = json.loads((work / "results" / "py" / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["done"] * 4
    assert "throughput_tok_s" in _text(sweep) and "dynamic" in _text(sweep)
    assert _images(plot) == 1  # one curve, inline
    assert "text/html" in sql.outputs[0]["data"]  # a DataFrame
    assert re.search(r"naive: capacity [0-9.]+ req/s, saturated [0-9.]+ req/s", _text(capacity))
    # the class came to the scheduler's process by value, and its own Params default held: batches of at most 4
    [run] = [p.parent for p in (work / "runs").glob("*/summary.json")]
    settings = json.loads((run / "summary.json").read_text())["settings"]
    assert settings["strategy"] == "__main__:FixedBatch" and settings["strategy_sha256"].startswith("sha256:")
    assert settings["strategy_args"] == {"max_batch_size": 4} and settings["max_batch_size"] == 16
    sizes = pd.read_parquet(run / "batches.parquet")["size"]
    assert sizes.max() == 4 and (sizes == 4).sum() >= len(sizes) - 1 and "finished" in _text(strategy)
    # the report wrote its files, and the notebook's next plot still showed inline
    assert (work / "results" / "py" / "REPORT.html").is_file() and _images(report) == 1
    assert "backend: module://matplotlib_inline.backend_inline" in _text(report)


@pytest.mark.slow
def test_a_resumed_sweep_reuses_every_point_and_says_so_through_the_callback(executed):
    _, work = executed
    names: dict = {"__name__": "readme"}  # its definitions, not its guarded run
    exec(readme_scripts()[0], names)  # noqa: S102  (README's own code)
    out = work / "results" / "py"
    before = json.loads((out / "sweep.json").read_text())["points"]
    events: list[api.Event] = []
    result = api.sweep(names["PLAN"], out, on_progress=events.append)  # nothing to measure again
    assert [r.status for r in result.records] == ["skipped"] * 4
    assert {(r.label, r.rate) for r in result.records} == {(p["label"], p["rate"]) for p in before}
    assert [e.kind for e in events if e.kind != "study"] == ["start"] + ["finished"] * 4 and events[0].total == 4
    assert [e.done for e in events if e.kind == "study"] == [1, 2, 3, 4]  # the study's line, a point at a time
    assert result.measured == 4 and result.failed == 0 and len(result.summaries()) == 4
    assert len(result.requests()) == sum(s.scheduled for s in result.summaries().values())
