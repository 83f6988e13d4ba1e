"""Every file the report writes goes through write_file: a new temporary file created in the target's
folder (create-exclusive, so never through a link), then renamed over the name. A rename replaces a
link rather than following it, so a REPORT.md or a PNG that is a link to a file elsewhere can never make
the report write there; refuse_links says so first, one line per link, before anything is written."""
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from batchlab.protocol.errors import term

FILE_MODE = 0o644  # what a plain open() gives under the usual umask: the report is for reading

REPORT_FILES = ("REPORT.md", "REPORT.html", "latency_vs_throughput.png", "latency_vs_concurrency.png",
                "latency_cdf.png", "itl_distribution.png", "batch_timeline.png", "batch_size_queue.png")


def link_problems(root: Path, names: tuple[str, ...] = REPORT_FILES) -> list[str]:
    """One line per report file name in `root` that exists as something other than a regular file."""
    lines = []
    for name in names:
        path = root / name
        if path.is_symlink():
            lines.append(f"{path}: is a link (to {os.readlink(path)}); the report writes only its own regular "
                         f"files: remove it, or give {term('--out', 'out')} another folder")
        elif path.exists() and not path.is_file():
            lines.append(f"{path}: is not a regular file; the report writes only its own regular files")
    return lines


def write_file(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """`write(f)` fills a new file (f: open for binary writing) that then takes `path`'s name; the
    temporary file never outlives a failed write."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return path


def write_text(path: Path, text: str) -> Path:
    """`text` (UTF-8) as the file `path`, through write_file."""
    return write_file(path, lambda f: f.write(text.encode("utf-8")))
