"""`batchlab run`: start collector, scheduler, worker(s) and traffic as processes and watch them."""
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from cli import roles
from cli.config import RunConfig
from protocol.sockets import Addresses

log = logging.getLogger("batchlab.launcher")
POLL_S = 0.2
STOP_GRACE_S = 30.0  # how long children get to finish after a stop before they are killed
COLLECTOR_GRACE_S = 12.0  # the collector's own wait for worker byes is 10 s


class RunFailed(RuntimeError):
    """A child process died; the message names it."""


@dataclass
class Child:
    """One launched role."""

    name: str
    proc: mp.Process


def _entry(target, args: tuple) -> None:
    """Child main: run the role; its return value is the exit code; a crash goes into its log too."""
    try:
        code = target(*args)
    except Exception:
        logging.getLogger("batchlab").exception("%s crashed", mp.current_process().name)
        raise
    raise SystemExit(code)


def _start(ctx, name: str, target, *args) -> Child:
    proc = ctx.Process(target=_entry, args=(target, args), name=name, daemon=False)
    proc.start()
    return Child(name, proc)


def launch_run(cfg: RunConfig, *, slos: dict | None = None, on_tick=None) -> dict:
    """Run everything to the end; return the summary. Raises RunFailed naming a dead child."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.as_settings(), sort_keys=False))
    cfg = _with_schedule(cfg, out)
    tmp = tempfile.mkdtemp(prefix="batchlab-")
    addrs = Addresses.ipc(tmp)
    ctx = mp.get_context("spawn")  # fork is unsafe with torch/vLLM threads
    stream_ended = ctx.Event()  # set when traffic dies: the scheduler then ends the stream
    children = [_start(ctx, "collector", roles.collector_role, cfg, addrs.collector, slos),
                _start(ctx, "scheduler", roles.scheduler_role, cfg, addrs.scheduler, addrs.collector,
                       stream_ended)]
    children += [_start(ctx, f"worker-{i}", roles.worker_role, cfg, addrs.scheduler, addrs.collector,
                        f"worker-{i}") for i in range(cfg.workers)]
    children.append(_start(ctx, "traffic", roles.traffic_role, cfg, addrs.scheduler))
    (out / "pids.json").write_text(json.dumps({c.name: c.proc.pid for c in children}))
    try:
        _watch(children, on_tick, stream_ended)
    except KeyboardInterrupt:
        _stop(children, signal.SIGINT)
        raise
    finally:
        _stop(children, signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)
    summary_path = out / "summary.json"
    if not summary_path.exists():
        raise RunFailed(f"the collector wrote no summary in {out}")
    return json.loads(summary_path.read_text())


def _with_schedule(cfg: RunConfig, out: Path) -> RunConfig:
    """Build (or check) the schedule here, so a bad dataset fails before any process starts; the
    traffic process then replays the saved file."""
    from dataclasses import replace

    from traffic.schedule import save_schedule

    path = out / "schedule.parquet"
    save_schedule(roles.make_schedule(cfg), path)
    return replace(cfg, schedule=str(path))


def _watch(children: list[Child], on_tick, stream_ended) -> None:
    """Wait for every child. A dead collector or scheduler, or the last worker, stops the run; a dead
    traffic process or one of several workers does not: the scheduler notices and the run goes on."""
    t_start, reported = time.monotonic(), set()
    while any(c.proc.is_alive() for c in children):
        for c in children:
            code = c.proc.exitcode
            if code in (None, 0) or c.name in reported:
                continue
            reported.add(c.name)
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            message = f"{c.name} died ({how}); see its log in the out folder's logs/"
            if _fatal(c, children):
                _stop(children, signal.SIGTERM)
                raise RunFailed(message)
            log.warning("%s; the run goes on", message)
            if c.name == "traffic":  # it may have died before its hello: tell the scheduler directly
                stream_ended.set()
        if on_tick is not None:
            on_tick(time.monotonic() - t_start, {c.name: c.proc.is_alive() for c in children})
        if not any(c.proc.is_alive() for c in children if c.name in ("scheduler", "collector")):
            _stop(children, signal.SIGTERM)  # the run is over: a worker that never joined it must not wait
            return
        time.sleep(POLL_S)


def _fatal(dead: Child, children: list[Child]) -> bool:
    if dead.name == "traffic":
        return dead.proc.exitcode > 0  # killed: the scheduler ends the stream; crashed: a bug to show
    if dead.name.startswith("worker-"):
        return not any(c.proc.is_alive() for c in children if c.name.startswith("worker-"))
    return True


def _stop(children: list[Child], sig: int) -> None:
    """Stop the producers first, then give the collector time to write before it is told to stop."""
    producers = [c for c in children if c.name != "collector"]
    collector = [c for c in children if c.name == "collector"]
    _signal_and_join(producers, sig, STOP_GRACE_S)
    for c in collector:
        c.proc.join(timeout=COLLECTOR_GRACE_S)  # it ends by itself once RunEnd and the byes arrive
    _signal_and_join(collector, signal.SIGTERM, STOP_GRACE_S)


def _signal_and_join(children: list[Child], sig: int, grace_s: float) -> None:
    for c in children:
        if c.proc.is_alive():
            try:
                os.kill(c.proc.pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for c in children:
        c.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if c.proc.is_alive():
            c.proc.kill()
            c.proc.join()
