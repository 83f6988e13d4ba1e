"""A command's output whose reader may go away: `batchlab run … | head -c 1` closes the pipe after one
byte, and a closed terminal (SIGHUP) fails every later write. Neither is an error of the run: from the
first write that finds its reader gone, that stream goes to /dev/null, and the command goes on to its
end, so its exit code says how the run went. Handled here once, at the command's edge (cli.main)."""
import contextlib
import errno
import os
import sys

GONE_ERRNOS = (errno.EPIPE, errno.EIO)  # a pipe's reader closed it; the terminal is gone


class ReaderSafe:
    """A text stream's stand-in: writes and flushes pass through until the reader is gone, then the
    stream's file descriptor is pointed at /dev/null (so its buffered rest, flushed at exit, goes there
    too) and what follows is dropped. Everything else is the stream's own."""

    def __init__(self, stream) -> None:
        self._stream, self.gone = stream, False

    def write(self, text) -> int:
        """Write through, or drop once the reader is gone."""
        if not self.gone:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._lost(exc)
        return len(text)

    def flush(self) -> None:
        """Flush through, unless the reader is gone."""
        if not self.gone:
            try:
                self._stream.flush()
            except OSError as exc:
                self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        if exc.errno not in GONE_ERRNOS:
            raise exc
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def readers_may_leave():
    """Inside, sys.stdout and sys.stderr are ReaderSafe; both are flushed (safely) on the way out and the
    streams before come back."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ReaderSafe(sys.stdout), ReaderSafe(sys.stderr)
    try:
        yield
    finally:
        for safe in (sys.stdout, sys.stderr):
            if isinstance(safe, ReaderSafe):
                safe.flush()
        sys.stdout, sys.stderr = before
