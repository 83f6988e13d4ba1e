"""The API's grid jobs: sweep (strategies × backends × rates × repeats, one live run per point,
resumable) and capacity (each strategy's μ and the highest rate it sustains). Both take a sweep plan:
its YAML's path, the same mapping (base: and grid:), or a parsed Plan. lab.sweep's docstring gives a
sweep folder's layout and when a point counts as done."""
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from batchlab.api.progress import CallbackView, OnProgress
from batchlab.api.results import CapacityResult, SweepResult

if TYPE_CHECKING:
    from batchlab.lab.sweep_plan import Plan
    from batchlab.protocol.study_settings import RaySettings


def plan_of(plan: "Plan | Mapping | str | Path", sets: dict | None = None) -> tuple["Plan", str]:
    """The parsed, checked plan and the YAML it came from ("" for a mapping or a Plan); `sets`: overrides
    as `--set` gives them ({"duration_s": 5, "grid.repeats": 2}). SweepError or ConfigError naming the key."""
    from batchlab.lab.sweep_plan import Plan, SweepError, load_plan, parse_plan

    if isinstance(plan, Plan):
        if sets:
            raise SweepError("sets apply to a plan's YAML or mapping, not to a parsed Plan")
        return copy.deepcopy(plan), ""
    if isinstance(plan, Mapping):
        return parse_plan(copy.deepcopy(dict(plan)), "the plan", sets), ""
    return load_plan(plan, sets), str(plan)


def _out_dir(out: str | Path | None, source: str, suffix: str = "") -> Path:
    """`out`, else results/<the YAML's name><suffix>; a plan given as a mapping must name its folder."""
    from batchlab.lab.sweep_plan import SweepError

    if out is not None:
        return Path(out)
    if not source:
        raise SweepError("out: a plan given as a mapping or Plan needs an output folder")
    return Path("results") / f"{Path(source).stem}{suffix}"


def sweep(plan: "Plan | Mapping | str | Path", out: str | Path | None = None, *, resume: bool = True,
          sets: dict | None = None, on_progress: OnProgress | None = None,
          ray: "RaySettings | Mapping | str | None" = None) -> SweepResult:
    """Every point of the grid, one live run each (skipping those done before when `resume`); the folder
    and its index. Points that share their workers' settings run on the same warm workers: in the plan's
    order with every group's workers kept warm (interleaved), or group after group (grouped). A failed
    point is recorded, never raised; SweepError when no strategy's capacity could be bracketed. `ray`: run the
    points on a Ray cluster instead (docs/ray.md): its address ("local": a new local Ray) or its
    protocol.study_settings.RaySettings (a mapping of them: ConfigError for a bad one)."""
    from batchlab.lab.sweep import run_sweep
    from batchlab.runner.run_folder import held

    plan, source = plan_of(plan, sets)
    out_dir, view = _out_dir(out, source), CallbackView(on_progress)
    if ray is not None:
        from batchlab.lab.ray_sweep import run_ray_sweep
        from batchlab.protocol.settings import checked_group
        from batchlab.protocol.study_settings import RaySettings

        opts = ray if isinstance(ray, RaySettings) else checked_group(
            RaySettings, {"address": ray} if isinstance(ray, str) else dict(ray))
        with held(out_dir, "sweep"):  # one sweep in a folder at a time: a second one would delete its points
            return SweepResult(out_dir, run_ray_sweep(source, str(out_dir), opts, resume=resume, plan=plan,
                                                      view=view))
    with held(out_dir, "sweep"):
        return SweepResult(out_dir, run_sweep(plan, out_dir, resume=resume, view=view, source=source))


def capacity(plan: "Plan | Mapping | str | Path", out: str | Path | None = None, *,
             strategies: list[str] | None = None, simulated: bool = False, preset: str | None = None,
             on_progress: OnProgress | None = None, **search) -> CapacityResult:
    """Each strategy's saturated rate μ and capacity (served ≥ 99%, queue not growing, below μ, SLOs met
    by ≥ 90% with SLOs): live (each probe an ordinary point folder in `out`, on warm workers; default
    results/<YAML name>-capacity) or, `simulated`, in virtual time with the sim backend's step model
    (`preset`: one name or file, or "hf=P,hf-loop=P,vllm=P"; capacity.json goes to `out` only if given).
    `strategies`: only these grid labels. `search`: the grid's rates.auto settings to change
    (search_duration_s, saturated_duration_s, width, max_probes). SweepError for an unknown label or key."""
    from batchlab.lab.capacity_search import run_capacity
    from batchlab.runner.pool import PoolKeeper
    from batchlab.lab.sweep_plan import SweepError, checked_auto, interleaved
    from batchlab.collector.layout import CAPACITY_FILE, WORKERS_DIR
    from batchlab.protocol.files import write_json_atomic
    from batchlab.runner.run_folder import held

    plan, source = plan_of(plan)
    unknown = sorted(set(strategies or []) - {e.label for e in plan.entries})
    if unknown:
        raise SweepError(f"strategy: no grid entry labelled {', '.join(unknown)}")
    settings = checked_auto({**(plan.auto.model_dump() if plan.auto else {}),
                             **{k: v for k, v in search.items() if v is not None}}, "capacity options")
    if simulated:
        from batchlab.lab.simulate import assign_presets, simulated_capacity

        plan.base.update({"preset": preset} if preset else {})
        assign_presets(plan)  # each entry plays its own backend's step model, as in `simulate`
        doc = simulated_capacity(plan, settings, strategies)
        doc |= {"simulated": True}  # no plan_hash: a live search never takes it for its own on resume
        if out is not None:  # what the live search writes there, less the probes' folders
            Path(out).mkdir(parents=True, exist_ok=True)
            write_json_atomic(Path(out) / CAPACITY_FILE, doc, default=str)
        return CapacityResult(doc, None if out is None else Path(out))
    out_dir = _out_dir(out, source, "-capacity")
    with held(out_dir, "capacity search"), PoolKeeper(out_dir / WORKERS_DIR, keep_all=interleaved(plan)) as pools:
        doc = run_capacity(plan, out_dir, settings, pools, CallbackView(on_progress), strategies)
    return CapacityResult(doc, out_dir)
