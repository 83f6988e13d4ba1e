"""`batchlab sweep CONFIG --ray [ADDRESS]`: a sweep's worker groups as Ray actors across a cluster.

Each group of points that share their workers (runner.pool.worker_key) gets one actor (lab.ray_actor),
placed by Ray on a node with the resources its points ask for (lab.ray_actor); groups run at once on
different nodes, a group's points one after another on its warm workers. Each point's run folder comes
back into --out as a local sweep writes it, so report, resume and the run identity work unchanged. A
point whose node (or actor) was lost runs again on another node; its lost try is recorded in the point's
`attempts` in sweep.json, never as data. On Ctrl-C or a failure every actor stops what it started.
"""
import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchlab.protocol.outcomes import RunOutcome
from batchlab.runner.pool import worker_key
from batchlab.lab.ray_cluster import connect
from batchlab.lab.ray_actor import Ask, ask, declares_gpu_memory, refusals
from batchlab.lab.sweep_plan import Plan, Point, SweepError
from batchlab.lab.sweep_order import plan_points
from batchlab.lab.sweep_point import preflight, refuse_old_layout, reused
from batchlab.collector.layout import INDEX_FILE
from batchlab.protocol.errors import term
from batchlab.protocol.signals import sigint_held
from batchlab.protocol.files import output_folder, write_json_atomic
from batchlab.protocol.settings import ConfigError
from batchlab.protocol.study_settings import RaySettings

MAX_TRIES = 3  # tries of one point whose node was lost, before it is recorded failed
STOP_TIMEOUT_S = 60.0  # an actor's own stop (its processes terminated, then killed)
PLACEMENT_CHECK_S = 30.0  # with no point ending for this long, check that every group still fits a node
SETTLE_S = 5.0  # for the reply of a point the sweep stopped (its actor is stopped or killed by then)


@dataclass(slots=True)
class WorkerGroup:
    """One worker group: its points still to run, in order, and its actor."""

    label: str
    ask: Ask
    todo: list[int]  # indices into the sweep's points
    actor: object = None
    tries: dict[int, list[dict]] = field(default_factory=dict)


def run_ray_sweep(config: str, out: str, opts: RaySettings, *, resume: bool, plan: Plan, view) -> dict:
    """Every point of the grid on the cluster, skipping finished ones; returns the sweep.json index.
    `config`: the YAML the plan came from ("" for none), for the index; `view`: its progress
    (lab.progress.CallbackView's methods)."""
    out_dir = Path(out)
    if plan.auto:
        ray = term("--ray", "ray")
        raise SweepError(f"{ray} needs grid.rates as a list (a capacity probe for automatic rates runs without {ray}: "
                         "run one, then set the rates it found)")
    preflight(plan)
    refuse_old_layout(out_dir)
    points = plan_points(plan, plan.rates, out_dir)
    index = {"config": str(config), "base": plan.base, "rates": plan.rates, "repeats": plan.repeats,
             "order": "ray", "seed": plan.seed, "probe": None, "points": [p.record(RunOutcome.PENDING) for p in points],
             "entries": [{"label": e.label, **e.overrides} for e in plan.entries]}
    ray = connect(opts.address)
    groups = _groups(points, plan.base, opts, ray.nodes())
    output_folder(out_dir)
    view.start(len(points))
    for i, p in enumerate(points):  # done points whose recorded configuration is the one planned now
        if (record := reused(p, plan.base, resume, view)) is not None:
            index["points"][i] = record
            view.finished(p, record)
    for g in groups:
        g.todo = [i for i in g.todo if index["points"][i]["status"] != RunOutcome.SKIPPED]
    write_json_atomic(out_dir / INDEX_FILE, index, default=str)
    flight: dict = {}  # object ref → (group, point index)
    try:
        _drive(ray, groups, points, plan, index, out_dir, opts, view, flight)
    finally:
        stop_all(ray, groups)
        _settle(ray, flight)
    return index


def _groups(points: list[Point], base: dict, opts: RaySettings, nodes: list[dict]) -> list[WorkerGroup]:
    """Points grouped by worker key (a bad point alone), each group's ask; SweepError when no node can
    hold a group (before any actor starts)."""
    known = declares_gpu_memory(nodes)
    groups: dict = {}
    for i, p in enumerate(points):
        try:
            cfg = p.config(base)
            key = worker_key(cfg) or ("unpooled", p.entry.label)
        except ConfigError:  # fails on its own when it runs
            cfg, key = None, ("invalid", p.entry.label)
        if key not in groups:
            a = ask(cfg, cpus=opts.cpus, gpu_resource=opts.gpu_resource, gpu_memory_known=known) if cfg \
                else Ask({"CPU": opts.cpus})
            groups[key] = WorkerGroup(p.entry.label, a, [])
        groups[key].todo.append(i)
    refused = refusals({g.label: g.ask for g in groups.values()}, nodes)
    if refused:
        raise SweepError("refused before anything started: " + "; ".join(refused))
    return list(groups.values())


def _drive(ray, groups: list[WorkerGroup], points: list[Point], plan, index: dict, out_dir: Path,
           opts: RaySettings, view, flight: dict) -> None:
    """The loop: 1. each group with work and no point in flight sends its next one to its actor;
    2. wait for any point to end; 3. a finished point's folder lands in --out and the index is written;
    a lost node's point goes back to the front of its group, on a new actor."""
    from batchlab.lab.ray_actor import GroupRunner

    remote = ray.remote(GroupRunner)
    while any(g.todo for g in groups) or flight:
        for g in groups:  # 1.
            if g.todo and not any(fg is g for fg, _ in flight.values()):
                if g.actor is None:
                    g.actor = remote.options(max_concurrency=2, max_restarts=0, **g.ask.actor_options()) \
                        .remote(opts.shared)
                i = g.todo[0]
                view.note(f"{points[i].entry.label} λ={points[i].rate:g} rep {points[i].repeat}: sent to the cluster")
                rel = str(points[i].folder.relative_to(out_dir))  # its place in a node's staging folder
                flight[g.actor.run.remote(points[i], plan.base, plan.limits(), rel)] = (g, i)
        ready, _ = ray.wait(list(flight), num_returns=1, timeout=PLACEMENT_CHECK_S)  # 2.
        if not ready:
            _give_up_unplaceable(ray, groups, flight, points, index, view)
            continue
        g, i = flight.pop(ready[0])
        record = _landed(ray, ready[0], g, i, points[i], view)  # 3.
        if record is None:
            continue
        g.todo.pop(0)
        index["points"][i] = record | ({"attempts": g.tries[i]} if i in g.tries else {})
        view.finished(points[i], index["points"][i])
        write_json_atomic(out_dir / INDEX_FILE, index, default=str)
        if not g.todo:
            stop_all(ray, [g])
    write_json_atomic(out_dir / INDEX_FILE, index, default=str)


def _give_up_unplaceable(ray, groups: list[WorkerGroup], flight: dict, points: list[Point], index: dict, view) -> None:
    """A group that no live node can hold any more (its node was lost and no other has its resources)
    has its points recorded failed instead of waiting for a node forever."""
    lost = set(refusals({g.label: g.ask for g in groups if g.todo}, ray.nodes()))
    for g in [g for g in groups if g.todo and any(line.startswith(f"{g.label}:") for line in lost)]:
        reason = next(line for line in lost if line.startswith(f"{g.label}:"))
        for ref in [r for r, (fg, _) in flight.items() if fg is g]:
            flight.pop(ref)
        _drop_actor(ray, g)
        for i in g.todo:
            index["points"][i] = points[i].record(RunOutcome.FAILED, f"no live node can hold it now: {reason}")
            view.finished(points[i], index["points"][i])
        g.todo = []


def _landed(ray, ref, g: WorkerGroup, i: int, point: Point, view) -> dict | None:
    """The point's record with its folder unpacked into --out; None when its node was lost and it is to
    run again (on a new actor), or a failed record after MAX_TRIES lost tries."""
    from batchlab.lab.ray_actor import unpack

    try:
        reply = ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
            ray.exceptions.WorkerCrashedError) as exc:
        where = "its node or its actor was lost"
        tries = g.tries.setdefault(i, [])
        tries.append({"status": RunOutcome.FAILED, "reason": f"{where}: {type(exc).__name__}", "data": False})
        _drop_actor(ray, g)
        if len(tries) < MAX_TRIES:
            view.note(f"{'/'.join(point.folder.parts[-3:])}: {where} mid-point; running it again on another "
                      f"node (try {len(tries) + 1} of {MAX_TRIES}); the lost try is recorded failed")
            return None
        shutil.rmtree(point.folder, ignore_errors=True)
        return point.record(RunOutcome.FAILED, f"{where} on each of {MAX_TRIES} tries")
    except ray.exceptions.RayTaskError as exc:
        return point.record(RunOutcome.FAILED, f"on the cluster: {str(exc).strip().splitlines()[-1]}")
    if "tar" in reply:
        unpack(reply["tar"], point.folder)
    return reply["record"] | {"node": reply["node"]}


def _drop_actor(ray, g: WorkerGroup) -> None:
    if g.actor is not None:
        with contextlib.suppress(Exception):  # already gone with its node
            ray.kill(g.actor, no_restart=True)
    g.actor = None


def _settle(ray, flight: dict) -> None:
    """The replies of points the sweep stopped, fetched and dropped: Ray prints an error nobody fetched
    as a traceback ("Unhandled error"), after the sweep's own line."""
    for ref in list(flight):
        with contextlib.suppress(Exception):  # the point's "stopped", or its actor gone
            ray.get(ref, timeout=SETTLE_S)
    flight.clear()


def stop_all(ray, groups: list[WorkerGroup]) -> None:
    """Every group's actor stops what it started (its points' processes, its warm pool), then is killed.
    A Ctrl-C meanwhile cannot cut this short: it is held and raised again once every actor is stopped
    (mid-sweep, the sweep then stops; a SIGINT this process ignores stays ignored)."""
    with sigint_held():
        live = [g for g in groups if g.actor is not None]
        refs = [g.actor.stop.remote() for g in live]
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for ref in refs:
            try:
                ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
            except Exception:  # a lost node's actor; Ray ends what it had
                pass
        for g in live:
            _drop_actor(ray, g)
