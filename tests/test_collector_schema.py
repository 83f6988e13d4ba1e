"""requests.parquet's columns, their order and their types are the ones the collector wrote before the
request record (collector.request.RequestOutcome) declared them: a reader of older runs and a reader of new
ones see the same table. The expected schema was read (pyarrow.parquet.read_schema) from a
`batchlab run --backend sim` before the change; every way a requests table is written must give it."""
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from batchlab.collector import request
from batchlab.collector.parts import PartWriter, write_final
from batchlab.collector.process import finish_run
from batchlab.collector.store import RunStore
from batchlab.protocol import RunInfo
from tests.test_collector import SETTINGS, interleaved_run, run_store, script, unsent_schedule

# (column, Arrow type, the pandas metadata's numpy type) of requests.parquet as written before the record
WRITTEN = [
    ("request_id", "int64", "int64"), ("status", "large_string", "str"), ("error", "large_string", "str"),
    ("prompt_len", "int64", "int64"), ("output_len", "int64", "int64"), ("arrival_time", "double", "float64"),
    ("send_time", "double", "float64"), ("recv_time", "double", "float64"),
    ("scheduled_time", "double", "float64"), ("first_token_time", "double", "float64"),
    ("completion_time", "double", "float64"), ("queue_wait", "double", "float64"), ("ttft", "double", "float64"),
    ("tpot", "double", "float64"), ("e2e", "double", "float64"), ("n_tokens", "int64", "int64"),
    ("batch_id", "int64", "int64"), ("worker", "large_string", "str"), ("attempts", "int64", "int64"),
    ("submitted", "bool", "bool"),
    # the run's settings
    ("strategy", "large_string", "str"), ("backend", "large_string", "str"), ("model", "large_string", "str"),
    ("rate", "double", "float64"), ("concurrency", "int64", "int64"), ("arrival", "large_string", "str"),
    ("seed", "int64", "int64"),
    # the run's identity, added at the final write (dictionary-encoded text: no pandas metadata of their own)
    ("label", "dictionary<values=string, indices=int32, ordered=0>", None),
    ("strategy_args", "dictionary<values=string, indices=int32, ordered=0>", None),
    ("repeat", "int64", None), ("config_hash", "dictionary<values=string, indices=int32, ordered=0>", None),
]
RUN = {**SETTINGS, "concurrency": 0}  # the live run's settings carry every settings column


def schema_of(path) -> list[tuple[str, str, str | None]]:
    """(column, Arrow type, pandas metadata's numpy type) of a Parquet file's columns, in order."""
    schema = pq.read_schema(path)
    numpy = {c["name"]: c["numpy_type"] for c in json.loads(schema.metadata[b"pandas"])["columns"]}
    return [(f.name, str(f.type), numpy.get(f.name)) for f in schema]


def streamed(folder, messages: list, schedule: pd.DataFrame | None):
    """The live collector's way: parts taken while the run goes, merged at its end."""
    if schedule is not None:
        schedule.to_parquet(folder / "schedule.parquet")
    store, writer = RunStore(), PartWriter(folder)
    for i, msg in enumerate(messages):
        store.handle(msg)
        if i % 7 == 0:
            writer.write(store.take_parts())
    write_final(folder, finish_run(store, writer, folder, None))


def in_memory(folder, messages: list, schedule: pd.DataFrame | None):
    """The simulator's way: the tables built from memory at the end."""
    write_final(folder, run_store(messages).finish(schedule))


@pytest.mark.parametrize("write", [streamed, in_memory])
@pytest.mark.parametrize("case", ["run with unsent rows", "run", "no request at all", "only unsent rows"])
def test_requests_parquet_keeps_the_schema_written_before_the_record(tmp_path, write, case):
    run = interleaved_run(20, seed=5, first=10)[1:] + script()[1:] if case.startswith("run") else []
    messages = [RunInfo(RUN)] + run
    schedule = unsent_schedule(25) if "unsent" in case else None
    write(tmp_path, messages, schedule)
    written = schema_of(tmp_path / "requests.parquet")
    engine = [c for c in written if c[0].startswith("engine_")]  # an engine's own figures, where it sent any
    assert written == WRITTEN[:27] + engine + WRITTEN[27:]
    assert bool(engine) == case.startswith("run")


def test_part_files_have_the_final_schema_before_the_identity_columns(tmp_path):
    store, writer = RunStore(), PartWriter(tmp_path)
    for msg in [RunInfo(RUN)] + script()[1:]:
        store.handle(msg)
    writer.write(store.take_parts(final=True))
    (part,) = sorted((tmp_path / ".parts").glob("requests*"))
    assert schema_of(part) == WRITTEN[:-4]


def test_records_become_the_tables_first_columns_with_their_derived_latencies():
    record = request.RequestOutcome(request_id=3, status="finished", error="", arrival_time=1.0,
                                first_token_time=1.5, completion_time=2.5, output_len=3, n_tokens=3)
    row = request.table([record]).iloc[0]
    assert list(row.index) == [c for c, _, _ in WRITTEN[:len(request.DTYPES)]]
    assert (row["ttft"], row["e2e"], row["tpot"]) == (0.5, 1.5, 0.5)
    assert row["batch_id"] == -1 and row["worker"] == ""  # a field not given: its default


def test_a_column_without_a_default_must_be_given():
    with pytest.raises(TypeError, match="status"):
        request.columns_table(2, request_id=1, error="")
