"""Where the roles meet, declared once: the default (loopback) addresses and ports, a run's private ipc://
endpoints, and the routing ids a DEALER gives itself at a ROUTER. No zmq here, so the command line's options
take their defaults from it without importing zmq (`batchlab --help` stays instant).

The scheduler and the collector each bind a ROUTER: the scheduler's hears the traffic, the workers and each
worker's heartbeat thread, and sends to each by its routing id; the collector's hears the scheduler and the
workers, and answers by it (CollectorAck, and Heartbeat to the scheduler). Every other socket is a DEALER that
connects to one of them.
"""
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
SCHEDULER_PORT = 5557
COLLECTOR_PORT = 5558

# Routing ids (ZeroMQ identities) the peers are known by; a worker's own is its worker_id (settings).
TRAFFIC_ID = "traffic"  # the traffic's DEALER at the scheduler (its heartbeats' name too)
SCHEDULER_ID = "scheduler"  # the scheduler's DEALER at the collector, and the one peer a worker hears
COLLECTOR_ID = "collector"  # the collector's name in its heartbeats: the peer the scheduler hears on that link
HEARTBEAT_SUFFIX = ".hb"  # a worker's heartbeat DEALER at the scheduler: its worker_id and this


def heartbeat_id(worker_id: str) -> str:
    """The routing id of `worker_id`'s heartbeat socket (worker.outbox's thread) at the scheduler."""
    return f"{worker_id}{HEARTBEAT_SUFFIX}"


@dataclass(slots=True)
class Addresses:
    """Where the scheduler and the collector bind their ROUTERs. Override any of them."""

    scheduler: str = f"tcp://{LOOPBACK}:{SCHEDULER_PORT}"
    collector: str = f"tcp://{LOOPBACK}:{COLLECTOR_PORT}"

    @classmethod
    def ipc(cls, folder: str) -> "Addresses":
        """Private ipc:// endpoints in `folder` (what `batchlab run` uses: no port clashes)."""
        return cls(scheduler=f"ipc://{folder}/scheduler.sock", collector=f"ipc://{folder}/collector.sock")


DEFAULT = Addresses()  # the standalone roles' defaults (batchlab scheduler/collector/worker/traffic)
