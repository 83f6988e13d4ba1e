"""Running one batchlab run: its roles as processes (launcher, roles, procs), warm worker pools (pool), its
folder (run_folder), the checks before it starts (preflight, config) and what its end says (outcome, run_end).

A child that a run spawned holds SIGINT, SIGTERM and SIGHUP from its spawn (procs.start) until, first thing
in its entry, it is linked to its launcher and leads its own process group (procs.become_group_leader): the
collector outlives a signal sent to the launcher's whole group then (the launcher stops the roles in order and
the collector writes every row). Importing this package installs no signal handler; every handler is
protocol.signals's.
"""
import shutil
import tempfile
from pathlib import Path

TEMP_PREFIX = "batchlab-"  # a run's temp folder: batchlab-<owner pid>-<random> (procs.run_temp_folder)
TEMP_MARKER = ".batchlab-run-temp"  # written inside it at creation: its owner's pid


def temp_owner(folder: Path) -> int | None:
    """The pid a run temp folder's marker names, when it is one batchlab made (a real folder, not a link,
    named batchlab-<pid>-*, holding a marker that names that same pid); None for anything else: a folder
    is never taken for ours by its name alone."""
    owner = folder.name[len(TEMP_PREFIX):].split("-", 1)[0]
    if not (folder.name.startswith(TEMP_PREFIX) and owner.isdigit()) or folder.is_symlink():
        return None
    try:
        marked = (folder / TEMP_MARKER).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(owner) if marked == owner else None


def remove_temp_of(owner_pid: int) -> None:
    """Remove the run temp folders (procs.run_temp_folder) of `owner_pid`: only those its marker says it made."""
    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}{owner_pid}-*"):
        if temp_owner(folder) == owner_pid:
            shutil.rmtree(folder, ignore_errors=True)

