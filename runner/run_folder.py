"""A run's folder has one identity: a new folder per run by default, a used one refused unless
--overwrite, one run in it at a time, and run.json saying which configuration (its hash), when, where and
how it ended."""
import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from batchlab.protocol.outcomes import RunOutcome
from batchlab.protocol.run_dir import LOGS_DIR, RUN_FILE, SCHEDULE_FILE
from batchlab.protocol.environment import batchlab_version, environment, utc_now
from batchlab.protocol.files import output_folder, write_json_atomic
from batchlab.protocol.identity import config_hash, identity
from batchlab.protocol.errors import term
from batchlab.protocol.settings import ConfigError, RunConfig, said

RUNS_DIR = "runs"


def new_folder(cfg: RunConfig, root: str = RUNS_DIR) -> str:
    """runs/<UTC date-time>-<strategy>-<backend>, made here (empty): never one that exists, even when
    another run started in the same second picks its name at the same moment (the make is exclusive)."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{cfg.strategy}-{cfg.backend}"
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    output_folder(root)
    path, k = Path(root) / stem, 1
    while True:
        try:
            path.mkdir()
            return str(path)
        except FileExistsError:
            k += 1
            path = Path(root) / f"{stem}-{k}"


def describe(folder: Path) -> str:
    """What a used folder holds, for the refusal: the run's strategy, hash and start, if it says."""
    try:
        record = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return "files"
    ident = record.get("identity") or {}
    return (f"a run ({ident.get('strategy', '?')} on {ident.get('backend', '?')}, config "
            f"{record.get('config_hash', '?')}, started {record.get('started_utc', '?')})")


# What the other roles of one run write into a shared --out as they start (their logs, traffic's
# schedule): the collector started alone beside them may find these already there.
ROLE_FILES = frozenset({LOGS_DIR, SCHEDULE_FILE})


def claim(out: str, *, overwrite: bool, tolerate: frozenset = frozenset()) -> Path:
    """The run's folder, empty and locked for this process: a new one is made; one another live process
    holds is refused, and so is a used one (one line each) unless `overwrite`, which empties it first.
    Checked before any process starts. Entries named in `tolerate` do not make a folder used (and are
    kept). The lock lasts until `release` or this process's end, so of two runs started at once into
    one folder exactly one gets it."""
    folder = output_folder(out)
    _lock(folder, out)
    used = [c for c in folder.iterdir() if c.name not in tolerate]
    if used and not overwrite:
        release(folder)
        raise ConfigError(f"{said('out')} {out} already holds {describe(folder)}; pass "
                          f"{term('--overwrite', 'overwrite=True')} to replace it, or choose another folder (without "
                          f"{said('out')} each run gets a new one)")
    for child in used:
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return folder


_HELD: dict[Path, int] = {}  # the folders this process claimed: their locked descriptors
IN_USE_BY_RUN = ("{option} {out} is in use by another run that is still going; choose another folder (without "
                 "{option} each run gets a new one)")
IN_USE_BY_STUDY = ("{option} {out} is in use by another {what} or run that is still going; wait for it to end (a "
                   "{what} into it then resumes it) or choose another folder")


def _lock(folder: Path, out: str, in_use: str = IN_USE_BY_RUN) -> bool:
    """An exclusive lock on the folder itself (flock: the kernel drops it when this process ends, even
    killed, so no stale lock outlives a run); ConfigError (`in_use`, of `out`) when another process holds it.
    False when this process held it already or the file system has no flock (left unlocked)."""
    key = folder.resolve()
    if key in _HELD:  # this process's own claim (a command run twice in one process, a test)
        return False
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ConfigError(in_use.format(option=said("out"), out=out)) from None
        return False
    _HELD[key] = fd
    return True


@contextlib.contextmanager
def held(out: str | Path, what: str) -> Iterator[Path]:
    """A sweep's or a capacity search's folder (`what` names it in the refusal), made if need be and locked
    for this process while the block runs, as a run's is (`claim`): a second one into it, or a run, is
    refused in one line while this one goes; once it ended (or died) a later one may resume it."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{said('out')} {out} is a file, not a folder")
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    ours = _lock(folder, str(out), IN_USE_BY_STUDY.replace("{what}", what))
    try:
        yield folder
    finally:
        if ours:
            release(folder)
        if made and not any(folder.iterdir()):  # refused before it wrote anything: no folder is left either
            folder.rmdir()


def release(out: str | Path) -> None:
    """Let go of a folder `claim` locked (nothing if this process holds none)."""
    fd = _HELD.pop(Path(out).resolve(), None)
    if fd is not None:
        os.close(fd)


RESERVE_BYTES = 16 * 1024  # kept free for run.json's last write (about 2 KB): several times its size


class RunRecord:
    """OUT/run.json: the configuration's identity and hash, batchlab's version and commit, the
    launcher's environment, the UTC start and end, and the status ('running' until the run returns).
    Room for the last write is set aside at the start (OUT/.run.json.reserve, given back just before
    it), so a disk the run filled still gets the final status."""

    def __init__(self, out: Path, cfg: RunConfig) -> None:
        settings = cfg.as_settings()
        self.path = Path(out) / RUN_FILE
        self.reserve = self.path.with_name(f".{RUN_FILE}.reserve")
        self.data = {"config_hash": config_hash(settings), "identity": identity(settings),
                     "batchlab": batchlab_version(), "started_utc": utc_now(), "status": RunOutcome.RUNNING,
                     "launcher_environment": environment()}
        self._write()
        try:
            self.reserve.write_bytes(bytes(RESERVE_BYTES))
        except OSError:  # no room even now: the collector's failure names the cause
            self.reserve.unlink(missing_ok=True)

    def end(self, status: RunOutcome, reason: str = "", **facts) -> None:
        """The run returned: done, failed (a role died, or a fault lost requests: the exit code 2's line is the
        reason), stopped (a limit) or interrupted (protocol.outcomes)."""
        self.data.update(status=RunOutcome(status).value, ended_utc=utc_now(), **({"reason": reason} if reason else {}),
                         **facts)
        self.reserve.unlink(missing_ok=True)
        self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # a full disk is reported by the collector's own failure, with its cause
            write_json_atomic(self.path, self.data, default=str)
