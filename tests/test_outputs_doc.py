"""docs/outputs.md against the files a run writes: its column lists are the tables' columns, in order, and its
recipes for reading a sweep (Python and SQL) run as written on a sweep folder."""
import re
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.collector.parts import RUN_COLUMNS, SETTINGS_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "outputs.md").read_text()
IDENTITY = [*SETTINGS_COLUMNS, *RUN_COLUMNS]  # in the files' order, after each table's own columns


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A continuous and a static strategy at two rates, simulated (every table, steps too, in a second)."""
    out = tmp_path_factory.mktemp("doc") / "OUT"
    result = CliRunner().invoke(app, ["simulate", "--strategy", "continuous,dynamic", "--rate", "4,8.5",
                                      "--duration", "2", "--dataset", "synthetic", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def documented_columns() -> dict[str, list[str]]:
    """Table file → the column names the doc's columns table lists for it, in order."""
    rows = re.findall(r"^\| `(\w+)\.parquet` \| (`.*`) \|$", DOC, flags=re.M)
    return {table: re.findall(r"`(\w+)`", names) for table, names in rows}


def test_the_documented_columns_are_each_tables_columns_in_order(sweep):
    documented = documented_columns()
    assert set(documented) == {"requests", "tokens", "batches", "steps", "schedule"}
    run = next(sweep.glob("sweep_label=continuous/*/*"))
    for table, columns in documented.items():
        names = pq.read_schema(run / f"{table}.parquet").names
        own = names if table == "schedule" else names[:len(names) - len(IDENTITY)]
        assert own == columns, table
        assert table == "schedule" or names[len(own):] == IDENTITY, table


def test_the_documented_identity_columns_are_those_every_table_ends_with():
    section = DOC[DOC.index("**The run's identity columns**"):DOC.index("`schedule.parquet` (the traffic's input")]
    cells = re.findall(r"^\| (`[^|]*`) \|", section, flags=re.M)
    documented = [n for cell in cells for n in re.findall(r"`(\w+)`", cell)]
    assert sorted(documented) == sorted(IDENTITY)


def test_the_recipes_for_reading_a_sweep_run_as_written(sweep, monkeypatch):
    section = DOC[DOC.index("### Reading a sweep"):DOC.index("A report reads the runs")]
    python = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    monkeypatch.chdir(sweep.parent)
    names: dict = {}
    exec(python, names)  # noqa: S102  (the doc's own code)
    assert len(names["requests"]) == len(names["result"].requests()) > 0
    assert len(names["points"]) == 4
    sql = re.search(r"```sql\n(.*?)```", section, flags=re.S).group(1)
    for query in (q for q in sql.split(";") if q.strip()):
        query = "\n".join(ln for ln in query.splitlines() if not ln.strip().startswith("--"))
        assert len(duckdb.sql(query.replace("'OUT/", f"'{sweep}/")).fetchall()) == 4
