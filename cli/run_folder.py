"""A run's folder has one identity: a new folder per run by default, a used one refused unless
--overwrite, and run.json saying which configuration (its hash), when, where and how it ended."""
import json
import shutil
import time
from pathlib import Path

from batchlab.protocol.run_dir import LOGS_DIR, RUN_FILE, SCHEDULE_FILE
from batchlab.protocol.environment import batchlab_version, environment, utc_now
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.identity import config_hash, identity
from batchlab.protocol.settings import ConfigError, RunConfig

RUNS_DIR = "runs"


def new_folder(cfg: RunConfig, root: str = RUNS_DIR) -> str:
    """runs/<UTC date-time>-<strategy>-<backend>, never one that exists."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{cfg.strategy}-{cfg.backend}"
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    path, k = Path(root) / stem, 1
    while path.exists():
        k += 1
        path = Path(root) / f"{stem}-{k}"
    return str(path)


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
    """The run's folder, empty: a new one is made; a used one is refused (one line) unless `overwrite`,
    which empties it first. Checked before any process starts. Entries named in `tolerate` do not make
    a folder used (and are kept)."""
    if not str(out).strip():
        raise ConfigError("--out must name a folder")
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    used = [c for c in folder.iterdir() if c.name not in tolerate] if folder.is_dir() else []
    if used and not overwrite:
        raise ConfigError(f"--out {out} already holds {describe(folder)}; pass --overwrite to replace "
                          "it, or choose another folder (without --out each run gets a new one)")
    for child in used:
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class RunRecord:
    """OUT/run.json: the configuration's identity and hash, batchlab's version and commit, the
    launcher's environment, the UTC start and end, and the status ('running' until the run returns)."""

    def __init__(self, out: Path, cfg: RunConfig) -> None:
        settings = cfg.as_settings()
        self.path = Path(out) / RUN_FILE
        self.data = {"config_hash": config_hash(settings), "identity": identity(settings),
                     "batchlab": batchlab_version(), "started_utc": utc_now(), "status": "running",
                     "launcher_environment": environment()}
        self._write()

    def end(self, status: str, reason: str = "", **facts) -> None:
        """The run returned: 'done', 'failed', 'stopped' (a limit) or 'interrupted'."""
        self.data.update(status=status, ended_utc=utc_now(), **({"reason": reason} if reason else {}), **facts)
        self._write()

    def _write(self) -> None:
        try:
            write_json_atomic(self.path, self.data, default=str)
        except OSError:  # a full disk is reported by the collector's own failure, with its cause
            pass

