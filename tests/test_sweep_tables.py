"""A sweep's tables read as one: Hive-style point folders (sweep_label=<label>/sweep_rate=<r>/sweep_repeat=<k>,
values percent-encoded) whose keys are no column of any table, and the run's identity as columns of every table,
so DuckDB and pandas read and join a whole sweep (a `make run` folder, its report and capacity search beside the
points, too) without error, collision or parsing folder names, and batchlab.api reads it into DataFrames; sweeps
in the older layouts are still reported and refused for resume."""
import json
import shutil
from pathlib import Path
from urllib.parse import quote

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.lab.sweep_plan import SweepError
from batchlab.lab.sweep_point import refuse_old_layout
from batchlab import api
from batchlab.collector.layout import (CAPACITY_DIR, CONCURRENCY_KEY, LABEL_KEY, PROBE_DIR, RATE_KEY, REPEAT_KEY,
                                       SATURATED_DIR, WORKERS_DIR, point_dir, point_of, saturated_dir)
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
    assert (sweep / "sweep_label=sjf%20a%3Db%2Fc" / "sweep_rate=4" / "sweep_repeat=0" / "requests.parquet").is_file()
    found = {point_of(p.parent.relative_to(sweep)) for p in sweep.glob("sweep_label=*/*/*/point.json")}
    assert found == {(lb, float(r), 0) for lb in LABELS for r in RATES}


def test_no_partition_key_is_a_column_of_any_table(sweep):
    keys = {LABEL_KEY, RATE_KEY, REPEAT_KEY, CONCURRENCY_KEY}
    for path in sweep.glob("sweep_label=*/*/*/*.parquet"):
        assert not keys & set(pq.read_schema(path).names), path.name


def test_one_duckdb_query_counts_every_points_requests_the_keys_beside_the_typed_columns(sweep):
    counts = duckdb.sql(f"SELECT label, rate, repeat, sweep_label, sweep_rate, count(*) FROM "
                        f"read_parquet('{sweep}/**/requests.parquet', hive_partitioning=true) GROUP BY ALL").fetchall()
    expected = {(lb, r, 0): len(pd.read_parquet(sweep / point_dir(lb, r, 0) / "requests.parquet"))
                for lb in LABELS for r in RATES}
    assert {(lb, r, k): n for lb, r, k, _, _, n in counts} == {(lb, float(r), k): n for (lb, r, k), n in
                                                                expected.items()}
    assert all(key_label == lb and float(key_rate) == r for lb, r, _, key_label, key_rate, _ in counts)
    assert min(expected.values()) > 0


def test_every_table_names_its_run_and_the_variants_stay_apart(sweep):
    for name in ("requests", "tokens", "batches"):
        df = pd.concat([pd.read_parquet(f) for f in sorted(sweep.glob(f"sweep_label=*/*/*/{name}.parquet"))])
        assert set(SETTINGS_COLUMNS) | set(RUN_COLUMNS) <= set(df.columns), name
        assert set(df["strategy"].astype(str)) == {"sjf"}, name  # one strategy: only label and args tell
        args = df.groupby("label", observed=True)["strategy_args"].unique()
        assert {lb: [json.loads(a) for a in v] for lb, v in args.items()} == {
            lb: [given] for lb, given in LABELS.items()}, name
        points = df.groupby(["label", "rate", "repeat"], observed=True)["config_hash"].nunique()
        assert sorted(points.index) == sorted((lb, float(r), 0) for lb in LABELS for r in RATES), name
        assert (points == 1).all() and df["config_hash"].nunique() == len(points), name


def test_pandas_reads_the_sweeps_requests_as_one_table_with_the_folder_keys_beside_the_columns(sweep):
    files = sorted(sweep.glob("sweep_label=*/*/*/requests.parquet"))
    df = pd.read_parquet([str(f) for f in files])  # pyarrow's default: Hive partitions read, none collides
    per_point = df.groupby(["label", "rate", "repeat"], observed=True).size()
    assert per_point.to_dict() == {point_of(f.parent.relative_to(sweep)): len(pd.read_parquet(f)) for f in files}
    assert (df["label"].astype(str) == df["sweep_label"].astype(str)).all() and df["rate"].dtype == "float64"


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
    for config in sweep.glob("sweep_label=*/sweep_rate=*/sweep_repeat=*/config.yaml"):
        hashes = pd.read_parquet(config.parent / "requests.parquet", columns=["config_hash"])["config_hash"]
        recorded = json.loads((config.parent / "summary.json").read_text())["settings"]
        # the point's config, marked simulated (virtual time measured it: another configuration than a live run)
        assert set(hashes.astype(str)) == {config_hash(recorded)} == {
            config_hash({**yaml.safe_load(config.read_text()), "simulated": True})}


OLD_LAYOUTS = {  # a point's folder as the layouts before wrote it
    "v1": lambda p: f"strategy={quote(p['label'], safe='')}/rate={p['rate']:g}/repeat={p['repeat']}",
    "v0": lambda p: f"{p['label'].replace('/', '_')}/rate-{p['rate']:g}/rep-{p['repeat']}",
}


def old_layout_copy(sweep: Path, dest: Path, layout: str) -> Path:
    """The sweep as an older layout wrote it, sweep.json's dirs to match."""
    index = json.loads((sweep / "sweep.json").read_text())
    for point in index["points"]:
        old = OLD_LAYOUTS[layout](point)
        shutil.copytree(sweep / point["dir"], dest / old)
        point["dir"] = old
    (dest / "sweep.json").write_text(json.dumps(index))
    return dest


@pytest.mark.parametrize("layout", list(OLD_LAYOUTS))
def test_an_older_layouts_sweep_is_still_reported_and_read_and_refused_for_resume(sweep, tmp_path, layout):
    old = old_layout_copy(sweep, tmp_path / "old", layout)
    coll, new = load_collection(old), load_collection(sweep)
    points = [sorted((r.label, r.rate, r.repeat) for r in c.runs) for c in (coll, new)]
    assert points[0] == points[1] and len(points[0]) == len(LABELS) * len(RATES)
    assert len(api.load(old).requests()) == len(api.load(sweep).requests())
    with pytest.raises(SweepError, match=r"older folder layout \(strategy=<label>/rate=<r>/repeat=<k> or "):
        refuse_old_layout(old)
    refuse_old_layout(sweep)  # this layout resumes


def test_resuming_an_older_layouts_sweep_is_one_line_and_exit_1(sweep, tmp_path):
    old = old_layout_copy(sweep, tmp_path / "old", "v1")
    result = runner.invoke(app, ["sweep", str(sweep.parent / "sweep.yaml"), "--out", str(old)])
    assert result.exit_code == 1 and "older folder layout" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("label", ["naive", "sjf a=b/c", "100%", "x y=z", "ünï", "a%2Fb"])
def test_a_point_folder_is_one_folder_per_key_and_gives_back_any_label(label):
    folder = point_dir(label, 2.5, 3)
    assert [p.split("=")[0] for p in folder.parts] == [LABEL_KEY, RATE_KEY, REPEAT_KEY]
    assert point_of(Path("out") / folder) == (label, 2.5, 3)
    assert [p.split("=")[0] for p in saturated_dir(label, 1).parts] == [LABEL_KEY, RATE_KEY, REPEAT_KEY]


def test_an_older_point_folder_still_parses_and_other_folders_do_not():
    assert point_of(Path("out/dynamic/rate-12/rep-1")) == ("dynamic", 12.0, 1)
    assert point_of(Path("out/strategy=a%20b/rate=2.5/repeat=1")) == ("a b", 2.5, 1)
    assert point_of(Path("out/dynamic/rate-12")) is None and point_of(Path("a/b/c")) is None


@pytest.fixture(scope="module")
def make_run_folder(sweep, tmp_path_factory) -> Path:
    """A folder as `make run` leaves it: the points, REPORT.md, REPORT.html and plots, capacity.json, and the
    capacity search's saturated runs, probes and burst (copies of a point here), the warm workers' logs."""
    root = tmp_path_factory.mktemp("make-run") / "cpu"
    shutil.copytree(sweep, root)
    api.report(root)
    some = root / point_dir(next(iter(LABELS)), RATES[0], 0)
    for where in (root / SATURATED_DIR / saturated_dir("x", 0), root / CAPACITY_DIR / point_dir("x", 3.5, 0),
                  root / PROBE_DIR / point_dir("x", 24, 0)):
        shutil.copytree(some, where)
    (root / "capacity.json").write_text(json.dumps({"strategies": {}}))
    (root / WORKERS_DIR).mkdir()
    (root / WORKERS_DIR / "worker-0.out").write_text("log\n")
    return root


def test_a_make_run_folder_reads_in_pandas_and_duckdb_beside_its_report_and_search(make_run_folder):
    root = make_run_folder
    assert {"REPORT.md", "REPORT.html", "latency_vs_throughput.png"} <= {p.name for p in root.iterdir()}
    grid = pd.read_parquet(sorted(str(f) for f in root.glob("sweep_label=*/*/*/requests.parquet")))
    every = duckdb.sql(f"SELECT label, rate, sweep_label, sweep_rate, filename FROM read_parquet("
                       f"'{root}/**/requests.parquet', hive_partitioning=true, filename=true)").df()
    points = duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/sweep_label=*/**/requests.parquet', "
                        "hive_partitioning=true)").fetchall()[0][0]
    searched = every["filename"].str.contains("/_")  # the capacity search's runs, told apart by their folder
    assert points == len(grid) == (~searched).sum() and searched.sum() == 3 * len(pd.read_parquet(
        root / point_dir(next(iter(LABELS)), RATES[0], 0) / "requests.parquet"))
    loaded = api.load(root)
    assert len(loaded.requests()) == len(grid) and len(loaded.records) == len(LABELS) * len(RATES)


def test_the_api_reads_a_sweeps_tables_as_dataframes_with_the_identity_joined(sweep):
    result = api.load(sweep)
    requests, tokens, batches = result.requests(), result.tokens(), result.batches()
    for df in (requests, tokens, batches):
        assert {"label", "strategy", "rate", "repeat", "config_hash"} <= set(df.columns)
        assert set(df["label"]) == set(LABELS) and set(df["rate"]) == {float(r) for r in RATES}
    files = {lb: sum(len(pd.read_parquet(sweep / point_dir(lb, r, 0) / "tokens.parquet")) for r in RATES)
             for lb in LABELS}
    assert tokens.groupby("label", observed=True).size().to_dict() == files
    points = result.points()
    assert len(points) == len(LABELS) * len(RATES) and set(points["status"]) == {"done"}
    assert (points["finished"] > 0).all() and points["ttft_p50"].notna().all()
    by_sql = result.sql("SELECT label, count(*) AS n FROM requests GROUP BY label ORDER BY label")
    assert dict(zip(by_sql["label"], by_sql["n"])) == requests.groupby("label", observed=True).size().to_dict()
    assert result.sql("SELECT count(*) AS n FROM points")["n"][0] == len(points)
    assert set(result.requests(columns=["ttft"]).columns) >= {"ttft", "label", "rate"}


def test_a_run_killed_before_its_final_write_is_read_from_its_part_files_with_its_identity(sweep, tmp_path):
    from batchlab.collector.reading import read_table
    from batchlab.protocol.run_dir import RunDir

    point = next(sweep.glob(f"{LABEL_KEY}=*/{RATE_KEY}=*/{REPEAT_KEY}=*"))
    killed = tmp_path / "killed"
    shutil.copytree(point, killed)
    final = RunDir(killed).table("requests")
    whole = pd.read_parquet(final)
    bare = whole.drop(columns=[c for c in (*SETTINGS_COLUMNS, *RUN_COLUMNS) if c in whole])
    RunDir(killed).parts_dir.mkdir(exist_ok=True)
    half = len(bare) // 2
    bare.iloc[:half + 1].to_parquet(RunDir(killed).part("requests", 0))  # a row written again in the next part
    bare.iloc[half:].to_parquet(RunDir(killed).part("requests", 1))
    final.unlink()
    got = read_table([killed], "requests", ["request_id"])
    assert sorted(got["request_id"]) == sorted(whole["request_id"])  # each row once
    assert got["config_hash"].nunique() == 1 and got["config_hash"].iloc[0] == whole["config_hash"].iloc[0]
    assert read_table([tmp_path / "nothing"], "requests").empty
