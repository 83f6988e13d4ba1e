"""The Ray actor that runs one worker group's points on its node: a warm pool (runner.pool) kept across the
group's points, each point's roles all started there (one clock), its run folder sent back as a tarball
or written in place on storage every node shares.

And where a sweep's worker groups may go on the cluster (ask, refusals): what a group's points ask of a
node, and the groups no node could hold (refused before anything starts). Pure: nodes come as ray.nodes()
gives them.
"""
import contextlib
import io
import math
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from batchlab.protocol.settings import RunConfig

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
    with contextlib.suppress(Exception):  # psutil.NoSuchProcess / AccessDenied: it is gone or not ours
        getattr(proc, how)()


GPU_MEMORY = "gpu_memory_gib"  # a node's GPU memory in all, GiB, as a custom resource it declares
WEIGHTS_HEADROOM = 1.2  # weights × this: activations, the KV cache's minimum, the CUDA context
MODEL_BACKENDS = ("hf", "vllm")


@dataclass(slots=True)
class Ask:
    """What one group's points ask of a node (Ray's resource names: CPU, GPU or a stand-in, memory)."""

    resources: dict[str, float]
    weights_bytes: int = 0  # the model's weights on disk; 0: unknown or none

    def actor_options(self) -> dict:
        """ray.remote(...).options() for an actor holding these."""
        res = dict(self.resources)
        opts = {"num_cpus": res.pop("CPU", 0), "num_gpus": res.pop("GPU", 0)}
        if "memory" in res:
            opts["memory"] = res.pop("memory")
        return opts | ({"resources": res} if res else {})


def on_gpu(cfg: RunConfig) -> bool:
    """A model backend whose device is not the CPU (auto counts as a GPU on a cluster)."""
    return cfg.backend in MODEL_BACKENDS and cfg.device != "cpu"


def ask(cfg: RunConfig, *, cpus: float = 1.0, gpu_resource: str = "GPU", gpu_memory_known: bool = False) -> Ask:
    """A point's needs: `cpus` CPUs; one GPU per worker × tensor × pipeline stage (counted in
    `gpu_resource`); the weights in host memory on CPU, or in GPU memory when nodes declare it."""
    resources = {"CPU": float(cpus)}
    weights = model_bytes(cfg.model) if cfg.backend in MODEL_BACKENDS else 0
    if on_gpu(cfg):
        resources[gpu_resource] = float(cfg.workers * cfg.tensor_parallel_size * cfg.pipeline_parallel_size)
        if weights and gpu_memory_known:
            resources[GPU_MEMORY] = math.ceil(weights * WEIGHTS_HEADROOM * cfg.workers / 2**30)
    elif weights:
        resources["memory"] = float(int(weights * WEIGHTS_HEADROOM * cfg.workers))
    return Ask(resources, weights)


def model_bytes(model: str) -> int:
    """The size of a model's weight files in a local folder or the Hugging Face cache; 0 if not found."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import constants
        except ImportError:
            return 0
        snapshots = Path(constants.HF_HUB_CACHE) / f"models--{model.replace('/', '--')}" / "snapshots"
        folders = sorted(snapshots.glob("*")) if snapshots.is_dir() else []
        if not folders:
            return 0
        folder = folders[-1]
    files = [f for pattern in ("*.safetensors", "*.bin", "*.pt") for f in folder.glob(pattern)]
    return sum(f.stat().st_size for f in files if f.is_file())


def alive_totals(nodes: list[dict]) -> list[dict[str, float]]:
    """Each live node's total resources."""
    return [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive", n.get("alive"))]


def declares_gpu_memory(nodes: list[dict]) -> bool:
    """Whether any live node states its GPU memory (then a model's weights are checked against it)."""
    return any(GPU_MEMORY in totals for totals in alive_totals(nodes))


def refusals(asks: dict[str, Ask], nodes: list[dict]) -> list[str]:
    """One line per group that no live node can hold, naming what it asks and the largest offer."""
    totals = alive_totals(nodes)
    lines = []
    for label, a in asks.items():
        if any(all(t.get(k, 0.0) >= v for k, v in a.resources.items()) for t in totals):
            continue
        short = {k: v for k, v in a.resources.items() if all(t.get(k, 0.0) < v for t in totals)}
        best = {k: max((t.get(k, 0.0) for t in totals), default=0.0) for k in short}
        what = ", ".join(f"{k} {_amount(k, v)} (largest node: {_amount(k, best[k])})" for k, v in short.items())
        model = f"; its model's weights are {a.weights_bytes / 2**30:.1f} GiB" if a.weights_bytes else ""
        lines.append(f"{label}: no node of the cluster has {what or 'all of ' + str(a.resources)}{model}")
    return lines


def _amount(key: str, value: float) -> str:
    return f"{value / 2**30:.1f} GiB" if key == "memory" else f"{value:g}"
