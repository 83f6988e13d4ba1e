"""The API's grid jobs: sweep (strategies × backends × rates × repeats, one live run per point, resumable),
capacity (each strategy's μ and the highest rate it sustains) and simulate (the grid in virtual time). Each
takes one plan, in one vocabulary (plan_of): a Plan, a sweep's mapping (base: and grid:) or a run's settings
(one strategy at one rate), or a YAML file's path holding either; `**changes` lay settings over it, the grid's
by their names (strategies, rates, repeats, seed, concurrency, order, point_timeout_s; a run's strategy and
rate as well), any other as a setting of every run. lab.sweep's docstring gives a sweep folder's layout."""
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from batchlab.protocol.outcomes import RunOutcome
from batchlab.api.guard import refuse_unguarded_main
from batchlab.api.progress import CallbackView, OnProgress
from batchlab.api.results import CapacityResult, PointRecord, SimulationResult, SweepResult
from batchlab.protocol.errors import ConfigError, SweepError, shown, term

if TYPE_CHECKING:
    from batchlab.lab.sweep_plan import Plan
    from batchlab.protocol.study_settings import RaySettings


def plan_of(plan: "Plan | Mapping | str | Path | None" = None, **changes) -> "Plan":
    """The parsed, checked plan (lab.sweep_plan.Plan) of what sweep, capacity and simulate take, `changes` laid
    over it; SweepError or ConfigError naming the key."""
    from batchlab.lab.sweep_plan import plan_from

    return plan_from({} if plan is None else plan, changes)[0]


def _out_dir(out: object, source: str, suffix: str = "", *, make: bool = True) -> Path:
    """`out` (made, unless not `make`), else results/<the YAML's name><suffix>; a plan given as a mapping or Plan
    must name it."""
    from batchlab.lab.sweep_plan import study_folder
    from batchlab.protocol.files import output_folder

    if out is None:
        if not source:
            raise SweepError(f"{term('--out', 'out')}: a plan given as a mapping or Plan needs an output folder")
        out = study_folder(source, suffix)
    if not isinstance(out, (str, Path)):
        raise ConfigError(f"{term('--out', 'out')} is a folder's path, not {shown(out)}")
    return output_folder(out) if make else Path(out)


def sweep(plan: "Plan | Mapping | str | Path", out: str | Path | None = None, *, resume: bool = True,
          on_progress: OnProgress | None = None, ray: "RaySettings | Mapping | str | None" = None,
          save_result: str | Path | None = None, **changes) -> SweepResult:
    """Every point of the grid, one live run each (skipping those done before when `resume`): its folder
    (default results/<the YAML's name>) and a record per point; its tables: requests(), points(), ...
    Points that share their workers' settings run on the same warm workers: in the plan's order with every
    group's workers kept warm (interleaved), or group after group (grouped). A failed point is recorded, never
    raised; SweepError when no strategy's capacity could be bracketed. `ray`: run the points on a Ray cluster
    instead (docs/ray.md): its address ("local": a new local Ray) or its RaySettings (or a mapping of them).
    `save_result`: a folder to write the points' results into in `vllm bench sweep`'s layout as well (a
    summary.json per point; collector.vllm_sweep), for `vllm bench sweep plot` / `plot_pareto`."""
    refuse_unguarded_main()
    from batchlab.lab.sweep_plan import plan_from
    from batchlab.protocol.study_settings import ray_settings

    ray = None if ray is None else ray_settings(ray)  # a bad Ray setting: before the plan is read
    parsed, source = plan_from(plan, changes)
    vllm_dir = _vllm_layout_dir(save_result, _out_dir(out, source, make=False))  # before any folder is made
    out_dir, view = _out_dir(out, source, make=ray is None), CallbackView(on_progress)  # on Ray: made once it may
    result = _sweep(parsed, source, out_dir, view, resume, ray)
    if vllm_dir is not None:
        from batchlab.collector.vllm_sweep import write_vllm_sweep

        write_vllm_sweep(result.records, vllm_dir)
    return result


def _vllm_layout_dir(save_result: object, out_dir: Path) -> Path | None:
    """The --save-result folder, refused where vLLM would read batchlab's own summary.json files in it."""
    if save_result is None:
        return None
    if not isinstance(save_result, (str, Path)):
        raise ConfigError(f"{term('--save-result', 'save_result')} is a folder, not a {type(save_result).__name__}")
    dest = Path(save_result).resolve()
    if dest == out_dir.resolve() or out_dir.resolve().is_relative_to(dest):
        raise ConfigError(f"{term('--save-result', 'save_result')} {save_result} holds the sweep's own folder "
                          f"{out_dir}: vLLM would read its runs' summary.json; give a folder of its own")
    return dest


def _sweep(parsed, source, out_dir: Path, view, resume: bool, ray: "RaySettings | None") -> SweepResult:
    """The sweep itself, here or on Ray."""
    from batchlab.lab.sweep import run_sweep
    from batchlab.runner.run_folder import held

    if ray is not None:
        from batchlab.lab.ray_sweep import run_ray_sweep

        with held(out_dir, "sweep"):  # one sweep in a folder at a time: a second one would delete its points
            return SweepResult.of(out_dir, run_ray_sweep(source, str(out_dir), ray, resume=resume, plan=parsed,
                                                         view=view))
    with held(out_dir, "sweep"):
        return SweepResult.of(out_dir, run_sweep(parsed, out_dir, resume=resume, view=view, source=source))


def capacity(plan: "Plan | Mapping | str | Path", out: str | Path | None = None, *, simulated: bool = False,
             on_progress: OnProgress | None = None, **changes) -> CapacityResult:
    """Each strategy's saturated rate μ and capacity (served ≥ 99%, queue not growing, below μ, SLOs met by
    ≥ 90% with SLOs): live (each probe an ordinary point folder in `out`, on warm workers; default
    results/<YAML name>-capacity) or, `simulated`, in virtual time with the sim backend's step model (capacity.json
    goes to `out` only if given). `changes` as sweep takes them (strategies=["naive"]: only that grid entry;
    preset: one name or file, or "hf=P,hf-loop=P,vllm=P" for a grid on several backends), and the search's own
    settings (search_duration_s, saturated_duration_s, saturated_repeats, width, max_probes, ...: the grid's
    rates.auto ones are the defaults)."""
    refuse_unguarded_main()
    from batchlab.collector.layout import CAPACITY_FILE, WORKERS_DIR
    from batchlab.lab.capacity_study import run_capacity
    from batchlab.lab.sweep_plan import CAPACITY_SUFFIX, changed, checked_auto, plan_from, refuse_new_labels
    from batchlab.lab.sweep_order import interleaved
    from batchlab.protocol.files import write_json_atomic
    from batchlab.protocol.settings import checked_group
    from batchlab.protocol.study_settings import AutoRates
    from batchlab.runner.pool import PoolKeeper
    from batchlab.runner.run_folder import held

    search = {k: changes.pop(k) for k in list(changes) if k in AutoRates.model_fields}
    checked_group(AutoRates, search)  # a bad search setting is named as given, before the plan is read
    strategies = changes.pop("strategies", None) or changes.pop("strategy", None)
    parsed, source = plan_from(plan, changes)
    if strategies is not None:  # only the grid's entries: a name that labels none is refused, not a new entry
        refuse_new_labels(parsed, strategies)
        parsed = changed(parsed, {"strategies": strategies})
    settings = checked_auto({**(parsed.auto.model_dump() if parsed.auto else {}),
                             **{k: v for k, v in search.items() if v is not None}}, "capacity options")
    if simulated:
        from batchlab.lab.simulate import assign_presets, simulated_capacity

        assign_presets(parsed)  # each entry plays its own backend's step model, as in `simulate`
        doc = simulated_capacity(parsed, settings) | {"simulated": True}  # no plan_hash: never a live search's
        if out is not None:  # what the live search writes there, less the probes' folders
            write_json_atomic(_out_dir(out, source) / CAPACITY_FILE, doc, default=str)
        return CapacityResult.of(doc, None if out is None else Path(out))
    out_dir = _out_dir(out, source, CAPACITY_SUFFIX)
    with (held(out_dir, "capacity search"),
          PoolKeeper(out_dir / WORKERS_DIR, keep_all=interleaved(parsed)) as pools):
        doc = run_capacity(parsed, out_dir, settings, pools, CallbackView(on_progress))
    return CapacityResult.of(doc, out_dir)


def simulate(plan: "Plan | Mapping | str | Path | None" = None, out: str | Path | None = None, *,
             on_progress: OnProgress | None = None, processes: int = 1, ray: str | None = None,
             **changes) -> SimulationResult:
    """The grid in virtual time (no processes, no sleeps), each point written as a live run's folder; what
    `batchlab simulate` does. `plan` as sweep takes it (None: one run of the default settings), `changes` laid
    over it (e.g. strategies=["naive", MyStrategy], rates=[5, 20], preset="3090-mistral-7b"); `out` (default
    results/<the YAML's name> for a sweep's YAML, else runs/simulated): a sweep's folder (sweep.json and a
    folder per point), or for one point its run's folder. A "finished" Event per point."""
    refuse_unguarded_main()
    from batchlab.lab.fanout import Fanout
    from batchlab.lab.simulate import plan_simulation, run_simulation

    from batchlab.protocol.files import output_folder

    if out is not None:
        changes["out"] = str(_out_dir(out, "", make=False))
    sim = plan_simulation(plan, changes)
    output_folder(sim.out)
    view = CallbackView(on_progress)
    results = run_simulation(sim, fanout=Fanout(processes, ray), on_point=lambda point, _summary, elapsed_s:
                             view.finished(point, point.record(RunOutcome.DONE, "", round(elapsed_s, 3))))
    records = [PointRecord(p.entry.label, str(s.settings.get("strategy", "")), str(s.settings.get("backend", "")),
                           None if p.concurrency else p.rate, p.concurrency, p.repeat, p.seed + p.repeat, p.folder,
                           RunOutcome.DONE) for p, s in results]
    index = _read_index(sim.out) if sim.layout else {}
    capacity = index.get("capacity")
    return SimulationResult(sim.out, records, None if not capacity else CapacityResult.of(capacity, None), index)


def _read_index(out: Path) -> dict:
    import json

    from batchlab.collector.layout import INDEX_FILE

    return json.loads((out / INDEX_FILE).read_text())
