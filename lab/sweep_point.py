"""One sweep point: run into a clean folder (a failure is recorded, never raised), or reused when resuming
and it measured what is planned now; and the checks a sweep makes before any point runs."""
import json
import shutil
import time
from pathlib import Path

from batchlab.protocol.outcomes import RunOutcome
from batchlab.runner.launcher import Limits, RunTimeout, launch_run
from batchlab.runner.outcome import verdict
from batchlab.runner.pool import PoolKeeper
from batchlab.lab.sweep_plan import Plan, Point, SweepError
from batchlab.protocol.errors import term
from batchlab.protocol.run_dir import RunDir
from batchlab.collector.layout import DONE_FILE, FAILED_FILE, INDEX_FILE, OLD_LAYOUTS, is_old_layout
from batchlab.collector.summary import SummaryError, headline, read_summary
from batchlab.collector.vllm_result import point_result
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.identity import config_hash, differences
from batchlab.protocol.settings import ConfigError


def _failure_reason(exc: Exception, folder: Path) -> str:
    """The exception, plus the last error line of the child logs when there is one."""
    hints = []
    logs = RunDir(folder).logs
    for log in sorted([*logs.glob("*.log"), *logs.glob("*.out")]):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln]
        hints += [f"{log.name}: {lines[-1].strip()}"] if lines else []
    return "\n".join([f"{type(exc).__name__}: {exc}", *hints])


def execute(point: Point, base: dict, on_tick=None, limits: Limits | None = None,
            pools: PoolKeeper | None = None) -> dict:
    """Run one point into a clean folder; a failure becomes FAILED.txt, never an exception.

    A run stopped at its limit keeps what finished (the rest failed) and is done, with a note; a run
    whose workers never got ready within the start-up limit measured nothing and is failed."""
    shutil.rmtree(point.folder, ignore_errors=True)  # leftovers of an interrupted or failed try
    point.folder.mkdir(parents=True)
    started, note = time.monotonic(), ""
    try:
        cfg = point.config(base)
        summary = launch_run(cfg, on_tick=on_tick, limits=limits, pool=pools.for_config(cfg) if pools else None)
    except (ConfigError, RuntimeError, OSError, ValueError) as exc:
        stopped = isinstance(exc, RunTimeout) and exc.phase == "run"
        if not stopped or not RunDir(point.folder).summary.exists():
            reason = _failure_reason(exc, point.folder)
            (point.folder / FAILED_FILE).write_text(reason + "\n")
            return point.record(RunOutcome.FAILED, reason, round(time.monotonic() - started, 2))
        summary, note = read_summary(point.folder), str(exc)  # unfinished requests: failed
    note = note or verdict(summary, summary.role_deaths)[1]  # what `batchlab run` would say about a fault
    point_result(point.folder)  # vllm_result.json: the figures under vllm bench serve's keys
    record = (point.record(RunOutcome.DONE, note, round(time.monotonic() - started, 2)) | _timing(point.folder)
              | {"config_hash": config_hash(cfg.as_settings())}
              | ({"interference": summary.interference} if summary.interference else {}))
    write_json_atomic(point.folder / DONE_FILE, {**record, "summary": headline(summary)}, default=str)
    return record


def preflight(plan: Plan) -> None:
    """Every strategy's settings checked (preset, model) before any process starts: ConfigError."""
    from batchlab.runner.preflight import check_before_start, checked_config

    for entry in plan.entries:
        try:
            check_before_start(checked_config({**plan.base, **entry.overrides, "out": "."}, {}))
        except ConfigError as exc:
            raise SweepError(f"grid.strategies {entry.label}: {exc}") from None


def refuse_old_layout(out_dir: Path) -> None:
    """SweepError when out_dir holds a sweep whose point folders are in the old layout: resuming it would
    measure every point again beside the old ones (`batchlab report` still reads it)."""
    try:
        points = json.loads((out_dir / INDEX_FILE).read_text()).get("points", [])
    except (OSError, ValueError, AttributeError):
        return
    if any(isinstance(p, dict) and is_old_layout(str(p.get("dir", ""))) for p in points):
        raise SweepError(f"{out_dir} holds a sweep in an older folder layout ({OLD_LAYOUTS}); batchlab report "
                         f"still reads it, but it cannot be resumed: sweep into a new {term('--out', 'out')}")


def reused(point: Point, base: dict, resume: bool, view=None) -> dict | None:
    """A done point's record, marked skipped, when resuming and it measured what is planned now; else
    None (to be measured), with a note naming the keys when its configuration changed."""
    done_file = point.folder / DONE_FILE
    if not (resume and done_file.exists()):
        return None
    changed = stale_point(point, base)
    if not changed:
        return json.loads(done_file.read_text()) | {"status": RunOutcome.SKIPPED}
    if view is not None:
        view.note(f"{'/'.join(point.folder.parts[-3:])}: measured with another configuration "
                  f"({'; '.join(changed)}); measuring it again")
    return None


def stale_point(point: Point, base: dict) -> list[str]:
    """How a done point's recorded configuration differs from the one planned now (['key old → new',
    ...]; [] when equal): a resumed sweep reuses a point only when it measured what is asked for now.
    The record is the run's own summary.json settings (every version wrote them), else its run.json."""
    try:
        planned = point.config(base).as_settings()
    except ConfigError as exc:  # measured again, so that the point fails with this reason
        return [f"its planned configuration is invalid: {exc}"]
    try:
        recorded = read_summary(point.folder).settings
    except SummaryError:
        try:
            recorded = json.loads(RunDir(point.folder).run.read_text()).get("identity")
        except (OSError, ValueError, AttributeError):
            return ["no readable record of its configuration"]
    return differences(recorded, planned) if isinstance(recorded, dict) else ["no record of its configuration"]


def _timing(folder: Path) -> dict:
    """Start-up seconds (launch until the traffic's Start: loads, compilation, warm-up) from the launcher."""
    path = RunDir(folder).timing
    return json.loads(path.read_text()) if path.exists() else {}


def finished_line(point, record: dict) -> str:
    """'dynamic λ=5 rep 0: done in 12.3s' (a failed point: its reason's first line)."""
    status = record["status"]
    took = f" in {record['elapsed_s']:.1f}s" if status != RunOutcome.SKIPPED and record.get("elapsed_s") else ""
    reason = f": {record['reason'].splitlines()[0]}" if status == RunOutcome.FAILED and record.get("reason") else ""
    return f"{point.entry.label} {load_text(point, '')} rep {point.repeat}: {status}{took}{reason}"


def load_text(point, unit: str = " req/s") -> str:
    """A sweep point's load: 'λ=5 req/s', or closed loop '4 clients'."""
    concurrency = getattr(point, "concurrency", 0)
    return f"{concurrency} clients" if concurrency else f"λ={point.rate:g}{unit}"
