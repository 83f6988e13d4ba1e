"""`batchlab report` on hostile folders made from one real sim run: a bad sweep.json, tables with missing
columns or columns of the wrong kind, negative counts, point folders outside the folder given, and report
files that are links to a file elsewhere. Each is one `error:` line naming the file, exit 1, no
traceback, and nothing written (outside the folder least of all)."""
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.report.output import REPORT_FILES, write_text
from tests.summaries import ZERO

SECRET = "not the report's to write\n"


@pytest.fixture
def real_run(dynamic_sim_run) -> Path:
    """One short sim run (the session's shared one), copied by every case (its own folder is never reported into)."""
    return dynamic_sim_run


def listing(folder: Path) -> dict[str, bytes | str]:
    """Every entry below `folder` (links not followed): a file's bytes, a link's target."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(dirpath, name)
            key = str(path.relative_to(folder))
            out[key] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return out


def report(folder: Path) -> tuple[int, list[str]]:
    """Exit code and output lines of `batchlab report FOLDER`; a traceback fails the test."""
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output.strip().splitlines()


def _table(run: Path, name: str, change) -> None:
    df = pd.read_parquet(run / f"{name}.parquet")
    change(df)
    df.to_parquet(run / f"{name}.parquet")


def _set(column: str, value):
    return lambda df: df.__setitem__(column, value)


def _drop(column: str):
    return lambda df: df.__delitem__(column)


def _summary(run: Path, **changes) -> None:
    path = run / "summary.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def _capacity(root: Path, **entry) -> None:
    """capacity.json whose naive and dynamic entries are `entry` (a sweep's strategy and its baseline)."""
    (root / "capacity.json").write_text(json.dumps({"strategies": {"naive": entry, "dynamic": entry}}))


def _index(root: Path, *points: dict) -> None:
    (root / "sweep.json").write_text(json.dumps({"points": list(points)}))


def _point(folder: str, **extra) -> dict:
    return {"label": "dynamic", "rate": 20, "repeat": 0, "status": "done", "dir": folder} | extra


# case → (how the copy of the run in root/"run" is made hostile, the bad file, what the line says)
CASES = {
    "sweep.json is a list": (lambda root, out: (root / "sweep.json").write_text("[1, 2]"),
                             "sweep.json", "not a batchlab sweep index (the file: input should be an object)"),
    "a sweep point without dir": (lambda root, out: _index(root, {k: v for k, v in _point("run").items() if k != "dir"}),
                                  "sweep.json", "points.0.dir: field required"),
    "requests without scheduled_time": (lambda root, out: _table(root / "run", "requests", _drop("scheduled_time")),
                                        "run/requests.parquet", "lacks the column scheduled_time"),
    "arrival_time as text": (lambda root, out: _table(root / "run", "requests", _set("arrival_time", "x")),
                             "run/requests.parquet", "arrival_time (str, not number)"),
    "n_tokens as text": (lambda root, out: _table(root / "run", "requests", _set("n_tokens", "7")),
                         "run/requests.parquet", "n_tokens (str, not number)"),
    "status as a number": (lambda root, out: _table(root / "run", "requests", _set("status", 3)),
                           "run/requests.parquet", "status (int64, not text)"),
    "a negative n_tokens": (lambda root, out: _table(root / "run", "requests", _set("n_tokens", -3)),
                            "run/requests.parquet", "has negative counts in n_tokens"),
    "a negative output_len": (lambda root, out: _table(root / "run", "requests", _set("output_len", -1)),
                              "run/requests.parquet", "has negative counts in output_len"),
    "token times as text": (lambda root, out: _table(root / "run", "tokens", _set("time", "soon")),
                            "run/tokens.parquet", "time (str, not number)"),
    "batch sizes as text": (lambda root, out: _table(root / "run", "batches", _set("size", "big")),
                            "run/batches.parquet", "size (str, not number)"),
    "a table that is not Parquet": (lambda root, out: (root / "run" / "tokens.parquet").write_text("PAR1 no"),
                                    "run/tokens.parquet", "cannot read it"),
    "capacity.json a list": (lambda root, out: (root / "capacity.json").write_text("[1, 2]"),
                             "capacity.json", "not a batchlab capacity file (the file: input should be an object)"),
    "a capacity bracket as text": (lambda root, out: (root / "capacity.json").write_text(
        json.dumps({"strategies": {"dynamic": {"lo_req_s": "fast"}}})), "capacity.json", "strategies.dynamic.lo_req_s"),
    "a closed bracket without its estimate": (
        lambda root, out: _capacity(root, lo_req_s=10.0, hi_req_s=12.0), "capacity.json",
        "lo_req_s and hi_req_s are given but estimate_req_s is not"),
    "saturated as text": (lambda root, out: _capacity(root, saturated="fast"), "capacity.json",
                          "strategies.naive.saturated"),
    "saturated as a list": (lambda root, out: _capacity(root, saturated=[4.0, 5.0]), "capacity.json",
                            "strategies.naive.saturated"),
    "capacity numbers as strings": (
        lambda root, out: _capacity(root, lo_req_s="10", hi_req_s="12", estimate_req_s="11"), "capacity.json",
        "strategies.naive.lo_req_s: input should be a valid number"),
    "a negative count": (lambda root, out: _summary(root / "run", finished=-5),
                         "run/summary.json", "finished: input should be greater than or equal to 0"),
    "a negative rate": (lambda root, out: _summary(root / "run", throughput_tok_s=-1.0),
                        "run/summary.json", "throughput_tok_s: value error, must not be negative"),
    "a point at an absolute folder outside": (lambda root, out: _index(root, _point(str(out))),
                                              "sweep.json", "is not inside"),
    "a point at ../ outside": (lambda root, out: _index(root, _point(os.path.relpath(out, root))),
                               "sweep.json", "is not inside"),
    "REPORT.html a link outside": (lambda root, out: (root / "run" / "REPORT.html").symlink_to(out / "secret.txt"),
                                   "run/REPORT.html", "is a link"),
    "REPORT.md a link outside": (lambda root, out: (root / "run" / "REPORT.md").symlink_to(out / "secret.txt"),
                                 "run/REPORT.md", "is a link"),
    "a plot a link outside": (lambda root, out: (root / "run" / "latency_cdf.png").symlink_to(out / "secret.txt"),
                              "run/latency_cdf.png", "is a link"),
}


@pytest.mark.slow  # one real sim run for the module
@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_folder_is_one_line_exit_1_and_nothing_written(real_run, tmp_path, case):
    make, bad, says = CASES[case]
    root, outside = tmp_path / "given", tmp_path / "outside"
    shutil.copytree(real_run, root / "run")
    shutil.copytree(real_run, outside)
    (outside / "secret.txt").write_text(SECRET)
    make(root, outside)
    reported = root / "run" if case.startswith(("REPORT", "a plot")) else root
    before, before_outside = listing(root), listing(outside)
    code, lines = report(reported)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"error: {root / bad}: "), lines
    assert says in lines[0]
    assert listing(root) == before and listing(outside) == before_outside  # the link's target included


@pytest.mark.slow
def test_every_bad_file_has_its_line_and_the_good_run_is_not_reported_alone(real_run, tmp_path):
    for name in ("a", "b", "c"):
        shutil.copytree(real_run, tmp_path / name)
    _table(tmp_path / "a", "requests", _drop("completion_time"))
    _summary(tmp_path / "b", scheduled=-1)
    _index(tmp_path, _point("a"), _point("b"), _point("c"), _point("/etc"))
    code, lines = report(tmp_path)
    assert code == 1 and len(lines) == 3, lines
    assert "a/requests.parquet" in lines[0] and "b/summary.json" in lines[1] and "'/etc'" in lines[2]
    assert not any((tmp_path / name).exists() for name in REPORT_FILES)


@pytest.mark.slow
def test_a_sound_run_is_reported_into_regular_files_the_report_names(real_run, tmp_path):
    shutil.copytree(real_run, tmp_path / "run")
    (tmp_path / "run" / "REPORT.md").write_text("an older report\n")  # a regular file: replaced
    before = set(listing(tmp_path / "run"))
    code, lines = report(tmp_path / "run")
    assert code == 0 and lines[-1].startswith("report: "), lines
    written = set(listing(tmp_path / "run")) - before
    assert written and written <= set(REPORT_FILES)  # no temporary file left, none beyond the known names
    for name in written | {"REPORT.md"}:
        path = tmp_path / "run" / name
        assert path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 == 0o644
    assert "an older report" not in (tmp_path / "run" / "REPORT.md").read_text()


def test_a_report_file_replaces_a_link_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text(SECRET)
    (tmp_path / "REPORT.md").symlink_to(target)  # as if it appeared after the report checked
    write_text(tmp_path / "REPORT.md", "# report\n")
    assert target.read_text() == SECRET
    assert not (tmp_path / "REPORT.md").is_symlink() and (tmp_path / "REPORT.md").read_text() == "# report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["REPORT.md", "elsewhere.txt"]


@pytest.mark.parametrize("field, value", [("submitted", -1), ("failure_reasons", {"x": -2}), ("window_s", -0.5),
                                          ("requests_per_s", -3.0), ("peak_memory_bytes", -1)])
def test_a_summary_with_a_negative_count_or_rate_is_refused(field, value):
    from pydantic import ValidationError

    from batchlab.collector.summary import Summary

    Summary.model_validate(ZERO)  # zero everywhere is a run that measured nothing: valid
    with pytest.raises(ValidationError, match="greater than or equal to 0|must not be negative"):
        Summary.model_validate(ZERO | {field: value})
