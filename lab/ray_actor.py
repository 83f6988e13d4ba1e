"""The Ray actor that runs one worker group's points on its node: a warm pool (runner.pool) kept across the
group's points, each point's roles all started there (one clock), its run folder sent back as a tarball
or written in place on storage every node shares.
"""
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

STOP_GRACE_S = 10.0  # after SIGTERM, how long the point's processes get before SIGKILL


def pack(folder: Path) -> bytes:
    """A run folder as a gzip tarball of its contents (paths relative to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for item in sorted(folder.iterdir()):
            tar.add(item, arcname=item.name)
    return buf.getvalue()


def unpack(data: bytes, folder: Path) -> None:
    """A tarball from pack() into a clean `folder` (what was there is replaced)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


class GroupRunner:
    """One worker group's points, one after another, on the node Ray placed this actor on."""

    def __init__(self, shared: bool) -> None:
        from batchlab.runner.pool import PoolKeeper
        from batchlab.collector.layout import WORKERS_DIR

        self.shared = shared  # the sweep's --out is on storage this node sees at the same path
        self.stage = Path(tempfile.mkdtemp(prefix="batchlab-ray-"))
        self.pools = PoolKeeper(self.stage / WORKERS_DIR)
        self.lock, self.stopped = threading.Lock(), False

    def where(self) -> dict:
        """This actor's node: Ray's node id, the host name and the process id."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "pid": os.getpid()}

    def run(self, point, base: dict, limits, rel: str) -> dict:
        """Run one point (lab.sweep_point.execute) here; its record, the node, and its folder's tarball."""
        from batchlab.lab.sweep_point import execute

        local = point if self.shared or _creatable(point.folder) else replace(point, folder=self.stage / rel)
        record = execute(local, base, None, limits, self.pools)
        if self.stopped:
            raise RuntimeError("the sweep stopped this point")
        reply = {"record": record, "node": self.where()}
        if not self.shared:
            reply["tar"] = pack(local.folder)
            shutil.rmtree(local.folder, ignore_errors=True)
            _prune(local.folder.parent, len(Path(rel).parts) - 1)
        return reply

    def stop(self) -> int:
        """End every process this actor started (the running point's roles, the warm pool) and remove
        its staging folder; returns how many processes were stopped. Runs beside run()."""
        import psutil

        with self.lock:
            self.stopped = True
            children = psutil.Process().children(recursive=True)
            for p in children:
                _signal(p, "terminate")
            _, alive = psutil.wait_procs(children, timeout=STOP_GRACE_S)
            for p in alive:
                _signal(p, "kill")
            psutil.wait_procs(alive, timeout=STOP_GRACE_S)
            self.pools.pools.clear()  # their processes are gone; nothing to close
            shutil.rmtree(self.stage, ignore_errors=True)
            return len(children)


def _creatable(folder: Path) -> bool:
    """Whether this node can write `folder` (the path the driver's --out gives it): then the run's
    recorded paths are the ones a local sweep records; else it runs in the actor's staging folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return os.access(folder, os.W_OK)
    except OSError:
        return False


def _prune(folder: Path, levels: int) -> None:
    """Remove `folder` and up to `levels - 1` parents while they are empty (a node's leftover tree)."""
    for _ in range(levels):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _signal(proc, how: str) -> None:
    try:
        getattr(proc, how)()
    except Exception:  # psutil.NoSuchProcess / AccessDenied: it is gone or not ours
        pass
