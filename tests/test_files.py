"""protocol.files: a file is replaced whole or not at all, and no temporary file is left behind."""
import json

import pytest

from batchlab.protocol.files import write_atomic, write_json_atomic, write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    write_json_atomic(path, {"finished": 3})
    assert json.loads(path.read_text()) == {"finished": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "table.parquet"
    write_text_atomic(path, "old")

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["table.parquet"]
