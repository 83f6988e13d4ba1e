"""Connecting to a Ray cluster, and a local one on loopback (tests, benchmarks, a laptop).

Ray rewrites a loopback node address (127.0.0.1) to the machine's interface address, so that other
hosts could reach the node; a cluster that must stay on one machine's loopback needs that rewrite
turned off in every Ray process that resolves an address: the `ray start` commands (run through this
module: `python -m batchlab.lab.ray_cluster start ...`) and the driver (connect(..., loopback=True)).
"""
import atexit
import contextlib
import os
import shutil
import socket
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from batchlab.protocol.errors import ClusterError, term
from batchlab.protocol.signals import handler_kept

LOOPBACK = "127.0.0.1"
NODE_IP_ENV = "BATCHLAB_RAY_NODE_IP"  # the driver's node address on a cluster (else Ray's own choice)
# Ray turns token authentication on for a new local cluster (writing ~/.ray/auth_token) and for any
# `ray start` or driver that finds that file: a cluster of this machine's loopback would then depend on
# the user's home. The clusters started here say their own setting, unless the user chose one.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
LOOPBACK_AUTH = {AUTH_MODE_ENV: "disabled"}
START_TIMEOUT_S = 120.0
STOP_WAIT_S = 10.0


def import_ray():
    """The ray module, or ClusterError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"{term('--ray', 'ray')} needs Ray: pip install 'batchlab[ray]'") from None
    return ray


def keep_on_loopback() -> None:
    """In this process, a loopback address stays loopback (Ray would swap in the interface address)."""
    import ray
    from ray._private import services

    def node_ip(address=None) -> str:
        node = ray._private.worker._global_node
        return node.node_ip_address if node is not None else LOOPBACK

    services.get_node_ip_address = node_ip
    services.resolve_ip_for_localhost = lambda host: host


def is_loopback(address: str | None) -> bool:
    """A local cluster (None, 'local') or an address on 127.0.0.1/localhost."""
    if address in (None, "", "local"):
        return True
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return host in (LOOPBACK, "localhost", "::1")


def connect(address: str | None):
    """ray.init on `address` (RAY_ADDRESS's forms: host:port, auto; None or 'local': a new local Ray on
    loopback); the driver's node address is 127.0.0.1 for a loopback cluster, else BATCHLAB_RAY_NODE_IP
    when set. Returns the ray module."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    node_ip = LOOPBACK if is_loopback(address) else os.environ.get(NODE_IP_ENV) or None
    if node_ip == LOOPBACK:
        keep_on_loopback()
    kwargs = {"_node_ip_address": node_ip} if node_ip else {}
    if address in (None, "", "local"):  # its own temp folder, removed at exit once Ray has stopped
        os.environ.setdefault(AUTH_MODE_ENV, LOOPBACK_AUTH[AUTH_MODE_ENV])  # its nodes inherit it
        temp_dir = tempfile.mkdtemp(prefix="blray-", dir="/tmp")
        atexit.register(_end_local, ray, temp_dir)
        kwargs.update(include_dashboard=False, num_cpus=os.cpu_count(), _temp_dir=temp_dir)
    try:  # ray.init puts its own SIGTERM handler (sys.exit) in place of the command's (exit 143, clean-up)
        with handler_kept(signal.SIGTERM):
            ray.init(address="local" if address in (None, "", "local") else address, log_to_driver=False,
                     configure_logging=False, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot connect to the Ray cluster at {address}: {' '.join(str(exc).split())[:200]}") \
            from None
    return ray


def _end_local(ray, temp_dir: str) -> None:
    """At exit: the local Ray this process started is stopped, then its temp folder removed."""
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class LocalNode:
    """One `ray start` on this machine: its temp folder (also its processes' TMPDIR, so what a killed
    node's actors staged goes with the cluster) and the daemons it left (pids)."""

    temp_dir: Path
    pids: list[int] = field(default_factory=list)


class LocalCluster:
    """A Ray cluster of nodes on this machine's loopback, started with `ray start` and stopped by the
    pids of what each start left (never `ray stop`, which ends every Ray process of the machine)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="blray-", dir="/tmp"))  # Ray's sockets: < 108 bytes
        self.port, self.nodes = free_port(), []

    @property
    def address(self) -> str:
        """The head's GCS address, host:port."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a driver of this cluster adds to its environment: the cluster's auth setting (a driver that
        found ~/.ray/auth_token would otherwise send a token the cluster does not expect)."""
        return dict(LOOPBACK_AUTH)

    def start_head(self, num_cpus: int = 1, resources: dict | None = None) -> LocalNode:
        """The head node (GCS and a raylet), no dashboard."""
        return self._start(["--head", "--port", str(self.port), "--include-dashboard=false",
                            "--dashboard-host", LOOPBACK], num_cpus, resources)

    def add_node(self, num_cpus: int = 1, resources: dict | None = None) -> LocalNode:
        """Another node joining the head."""
        return self._start(["--address", self.address], num_cpus, resources)

    def _start(self, args: list[str], num_cpus: int, resources: dict | None) -> LocalNode:
        import json

        node = LocalNode(Path(tempfile.mkdtemp(prefix=f"n{len(self.nodes)}-", dir=self.root)))
        cmd = [sys.executable, "-m", "batchlab.lab.ray_cluster", "start", *args, "--node-ip-address", LOOPBACK,
               "--num-cpus", str(num_cpus), "--num-gpus", "0", "--temp-dir", str(node.temp_dir),
               "--disable-usage-stats", "--object-store-memory", str(100 * 2**20)]
        if resources:
            cmd += ["--resources", json.dumps(resources)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S,
                              env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(node.temp_dir),
                                   **self.env})
        node.pids = _node_pids(node.temp_dir)
        self.nodes.append(node)
        if done.returncode != 0:
            raise ClusterError(f"ray start failed: {done.stderr.strip().splitlines()[-1:]}")
        return node

    def kill_node(self, node: LocalNode) -> None:
        """End one node at once (SIGKILL to its daemons and everything under them): a lost machine."""
        _kill_trees(node.pids)

    def stop(self) -> None:
        """End every node (workers and what they started first), then remove the temp folders."""
        for node in reversed(self.nodes):
            _kill_trees(node.pids)
        shutil.rmtree(self.root, ignore_errors=True)


def _node_pids(temp_dir: Path) -> list[int]:
    """The daemons a `ray start --temp-dir temp_dir` left: each names its folder on its command line or
    has it as TMPDIR (Ray's client server names no folder on its command line)."""
    return sorted(p.info["pid"] for p in psutil.process_iter(["pid", "cmdline", "environ"])
                  if str(temp_dir) in " ".join(p.info["cmdline"] or [])
                  or (p.info["environ"] or {}).get("TMPDIR") == str(temp_dir))


def _kill_trees(pids: list[int]) -> None:
    """SIGKILL each process and all its descendants; wait until they are gone."""
    procs = []
    for pid in pids:
        try:
            top = psutil.Process(pid)
            procs += [*top.children(recursive=True), top]
        except psutil.NoSuchProcess:
            continue
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=STOP_WAIT_S)


def main() -> None:
    """`python -m batchlab.lab.ray_cluster start ...`: Ray's own CLI, with loopback kept."""
    keep_on_loopback()
    from ray.scripts.scripts import main as ray_main

    ray_main()


if __name__ == "__main__":
    main()
