"""A run's temp folder is removed by its marker and its owner's pid, never by its name alone: a user's own
`batchlab-*` folder in TMPDIR survives the clean-up of stale run folders and a whole run."""
import os
import tempfile
from pathlib import Path

import pytest

from batchlab.runner import TEMP_MARKER, remove_temp_of, temp_owner
from batchlab.runner import procs
from tests.conftest import run_cli

DEAD_PID = 99_999_999  # above Linux's largest pid_max (2**22): no process has it
USER_FOLDERS = ("batchlab-2024-12-results", f"batchlab-{DEAD_PID}-mine")  # named like a run's, not made by one


@pytest.fixture
def tmpdir_of_user(tmp_path, monkeypatch) -> Path:
    """A TMPDIR holding a user's own folders whose names look like a run's temp folder's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in USER_FOLDERS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "precious.csv").write_text("a,b\n1,2\n")
    return tmp_path


def test_clean_up_of_stale_run_folders_leaves_a_users_folder_named_like_one(tmpdir_of_user):
    stale = tmpdir_of_user / f"batchlab-{DEAD_PID}-abcd1234"  # a SIGKILLed launcher's, marked
    stale.mkdir()
    (stale / TEMP_MARKER).write_text(str(DEAD_PID))
    procs.clean_stale_temp()
    remove_temp_of(2024)
    remove_temp_of(DEAD_PID)
    for name in USER_FOLDERS:
        assert (tmpdir_of_user / name / "precious.csv").read_text() == "a,b\n1,2\n"
    assert not stale.exists()


def test_a_marker_naming_another_pid_or_a_link_is_not_taken_for_a_run_folder(tmpdir_of_user):
    other = tmpdir_of_user / f"batchlab-{DEAD_PID}-other"
    other.mkdir()
    (other / TEMP_MARKER).write_text("1")  # marked, but by another owner than its name says
    elsewhere = tmpdir_of_user / "elsewhere"  # a folder the link points to, marked as the link's name would be
    elsewhere.mkdir()
    (elsewhere / "precious.csv").write_text("a,b\n1,2\n")
    (elsewhere / TEMP_MARKER).write_text(str(DEAD_PID))
    link = tmpdir_of_user / f"batchlab-{DEAD_PID}-link"
    link.symlink_to(elsewhere)
    assert temp_owner(other) is None and temp_owner(link) is None
    procs.clean_stale_temp()
    assert other.exists() and link.is_symlink() and (elsewhere / "precious.csv").exists()


def test_a_run_temp_folder_is_marked_with_its_owner_and_removed_as_its_own(tmpdir_of_user):
    folder = Path(procs.run_temp_folder())
    assert temp_owner(folder) == os.getpid()
    remove_temp_of(os.getpid())
    assert not folder.exists()


@pytest.mark.slow
def test_a_users_batchlab_folder_in_tmpdir_survives_a_run(tmp_path):
    tmpdir = Path(tempfile.mkdtemp(prefix="bl-", dir="/tmp"))  # short: the run's socket paths must fit
    try:
        for name in USER_FOLDERS:
            (tmpdir / name).mkdir()
            (tmpdir / name / "precious.csv").write_text("a,b\n1,2\n")
        run_cli("run", "--backend", "echo", "--rate", "20", "--duration", "1", "--out", str(tmp_path / "run"),
                env={"TMPDIR": str(tmpdir)})
        for name in USER_FOLDERS:
            assert (tmpdir / name / "precious.csv").read_text() == "a,b\n1,2\n"
        assert sorted(p.name for p in tmpdir.iterdir()) == sorted(USER_FOLDERS)  # the run's own is gone
    finally:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)
