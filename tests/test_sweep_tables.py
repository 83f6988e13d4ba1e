"""A sweep's tables read as one: Hive-style point folders (strategy=<label>/rate=<r>/repeat=<k>, values
percent-encoded) and the run's identity as columns of every table, so DuckDB and pandas join a whole
sweep without parsing folder names; an old-layout sweep is still reported and refused for resume."""
import json
import shutil
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.lab.sweep_plan import SweepError
from batchlab.lab.sweep_point import refuse_old_layout
from batchlab.collector.layout import point_dir, point_of
from batchlab.report.points import load_collection
from batchlab.collector.parts import RUN_COLUMNS, SETTINGS_COLUMNS
from batchlab.protocol.identity import config_hash

runner = CliRunner()
# two variants of one strategy, told apart only by their parameters; labels awkward in a path
LABELS = {"sjf a=b/c": {"predictor": "oracle"}, "sjf 100% noisy": {"predictor": "noisy", "noise": 1.0}}
RATES = (4, 8.5)  # a rate that is no whole number: DuckDB infers partitions as text unless told
SWEEP = {"base": {"backend": "sim", "preset": "a100-llama2-7b", "dataset": "synthetic", "duration_s": 2,
                  "max_new_tokens": 32, "warmup_requests": 0},
         "grid": {"strategies": [{"strategy": "sjf", "label": lb, "strategy_args": a} for lb, a in LABELS.items()],
                  "rates": list(RATES), "repeats": 1, "seed": 3}}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The grid simulated in virtual time (the tables a live sweep writes, in a second)."""
    root = tmp_path_factory.mktemp("hive")
    (root / "sweep.yaml").write_text(json.dumps(SWEEP))
    result = runner.invoke(app, ["simulate", str(root / "sweep.yaml"), "--out", str(root / "out")])
    assert result.exit_code == 0, result.output
    return root / "out"


def test_point_folders_are_hive_partitions_with_percent_encoded_labels(sweep):
    assert (sweep / "strategy=sjf%20a%3Db%2Fc" / "rate=4" / "repeat=0" / "requests.parquet").is_file()
    found = {point_of(p.parent.relative_to(sweep)) for p in sweep.glob("strategy=*/rate=*/repeat=*/point.json")}
    assert found == {(lb, float(r), 0) for lb in LABELS for r in RATES}


def test_one_duckdb_query_counts_every_points_requests(sweep):
    counts = duckdb.sql(f"SELECT strategy, rate, repeat, count(*) FROM read_parquet('{sweep}/**/requests.parquet', "
                        "hive_partitioning=true, hive_types={'rate': DOUBLE}) GROUP BY ALL").fetchall()
    expected = {(lb, r, 0): len(pd.read_parquet(sweep / point_dir(lb, r, 0) / "requests.parquet"))
                for lb in LABELS for r in RATES}
    assert {(s, r, k): n for s, r, k, n in counts} == {(lb, float(r), k): n for (lb, r, k), n in expected.items()}
    assert min(expected.values()) > 0


def test_every_table_names_its_run_and_the_variants_stay_apart(sweep):
    for name in ("requests", "tokens", "batches"):
        df = pd.concat([pd.read_parquet(f) for f in sorted(sweep.glob(f"strategy=*/*/*/{name}.parquet"))])
        assert set(SETTINGS_COLUMNS) | set(RUN_COLUMNS) <= set(df.columns), name
        assert set(df["strategy"].astype(str)) == {"sjf"}, name  # one strategy: only label and args tell
        args = df.groupby("label", observed=True)["strategy_args"].unique()
        assert {lb: [json.loads(a) for a in v] for lb, v in args.items()} == {
            lb: [given] for lb, given in LABELS.items()}, name
        points = df.groupby(["label", "rate", "repeat"], observed=True)["config_hash"].nunique()
        assert sorted(points.index) == sorted((lb, float(r), 0) for lb in LABELS for r in RATES), name
        assert (points == 1).all() and df["config_hash"].nunique() == len(points), name


def test_pandas_reads_the_sweeps_requests_as_one_table_without_their_folder_names(sweep):
    files = sorted(sweep.glob("strategy=*/rate=*/repeat=*/requests.parquet"))
    df = pd.read_parquet([str(f) for f in files], partitioning=None)  # the identity is in the files
    per_point = df.groupby(["label", "rate", "repeat"], observed=True).size()
    assert per_point.to_dict() == {point_of(f.parent.relative_to(sweep)): len(pd.read_parquet(f)) for f in files}


def test_tokens_join_requests_on_config_hash_and_request_id_across_points(sweep):
    joined = duckdb.sql(f"""
        SELECT r.label, r.rate, count(*) AS tokens
        FROM read_parquet('{sweep}/**/tokens.parquet', hive_partitioning=false) t
        JOIN read_parquet('{sweep}/**/requests.parquet', hive_partitioning=false) r USING (config_hash, request_id)
        GROUP BY ALL""").fetchall()
    assert len(joined) == len(LABELS) * len(RATES)
    for label, rate, tokens in joined:
        own = pd.read_parquet(sweep / point_dir(label, rate, 0) / "tokens.parquet")
        assert tokens == len(own) > 0  # every token row found its own request, none another point's


def test_the_config_hash_column_is_the_hash_of_the_settings_the_run_recorded(sweep):
    for config in sweep.glob("strategy=*/rate=*/repeat=*/config.yaml"):
        hashes = pd.read_parquet(config.parent / "requests.parquet", columns=["config_hash"])["config_hash"]
        recorded = json.loads((config.parent / "summary.json").read_text())["settings"]
        # the point's config, marked simulated (virtual time measured it: another configuration than a live run)
        assert set(hashes.astype(str)) == {config_hash(recorded)} == {
            config_hash({**yaml.safe_load(config.read_text()), "simulated": True})}


def old_layout_copy(sweep: Path, dest: Path) -> Path:
    """The sweep as the old layout wrote it: <label>/rate-<r>/rep-<k> and sweep.json's dirs to match."""
    index = json.loads((sweep / "sweep.json").read_text())
    for point in index["points"]:
        old = f"{point['label'].replace('/', '_')}/rate-{point['rate']:g}/rep-{point['repeat']}"
        shutil.copytree(sweep / point["dir"], dest / old)
        point["dir"] = old
    (dest / "sweep.json").write_text(json.dumps(index))
    return dest


def test_an_old_layout_sweep_is_still_reported_and_refused_for_resume(sweep, tmp_path):
    old = old_layout_copy(sweep, tmp_path / "old")
    coll, new = load_collection(old), load_collection(sweep)
    points = [sorted((r.label, r.rate, r.repeat) for r in c.runs) for c in (coll, new)]
    assert points[0] == points[1] and len(points[0]) == len(LABELS) * len(RATES)
    with pytest.raises(SweepError, match=r"old folder layout \(<label>/rate-<r>/rep-<k>\)"):
        refuse_old_layout(old)
    refuse_old_layout(sweep)  # the Hive layout resumes


def test_resuming_an_old_layout_sweep_is_one_line_and_exit_1(sweep, tmp_path):
    old = old_layout_copy(sweep, tmp_path / "old")
    result = runner.invoke(app, ["sweep", str(sweep.parent / "sweep.yaml"), "--out", str(old)])
    assert result.exit_code == 1 and "old folder layout" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("label", ["naive", "sjf a=b/c", "100%", "x y=z", "ünï", "a%2Fb"])
def test_a_point_folder_is_one_folder_per_key_and_gives_back_any_label(label):
    folder = point_dir(label, 2.5, 3)
    assert [p.split("=")[0] for p in folder.parts] == ["strategy", "rate", "repeat"]
    assert point_of(Path("out") / folder) == (label, 2.5, 3)


def test_an_old_point_folder_still_parses_and_other_folders_do_not():
    assert point_of(Path("out/dynamic/rate-12/rep-1")) == ("dynamic", 12.0, 1)
    assert point_of(Path("out/dynamic/rate-12")) is None and point_of(Path("a/b/c")) is None
