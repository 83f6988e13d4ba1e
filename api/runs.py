"""The API's single-run jobs: run (live processes), simulate (virtual time), tune (a knob search) and
report (REPORT.md from run folders). Heavy imports happen inside the functions: importing the API is cheap
and starts nothing."""
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from batchlab.api.progress import CallbackView, OnProgress, run_ticker
from batchlab.api.results import SimulationResult

if TYPE_CHECKING:
    from batchlab.report.build import ReportResult
    from batchlab.collector.summary import Summary
    from batchlab.protocol.settings import RunConfig


def run_config(settings: "RunConfig | Mapping | str | Path") -> tuple["RunConfig", bool]:
    """The run's settings, and whether they name their folder (`out`). A RunConfig is taken as given (pydantic
    checked its values; its strategy is resolved here); a mapping or a YAML file (a run's settings, as
    `batchlab run --config` reads) is checked as the command checks it: ConfigError naming the setting."""
    from batchlab.runner.config import checked_config, replay_config
    from batchlab.protocol.settings import RunConfig, load_yaml
    from batchlab.scheduler.strategies import resolve

    if isinstance(settings, RunConfig):
        resolve(settings)  # an unknown strategy or a bad parameter: ConfigError now, not a dead scheduler later
        return settings.model_copy(), "out" in settings.model_fields_set
    values = load_yaml(settings) if isinstance(settings, (str, Path)) else {k.replace("-", "_"): v for k, v in
                                                                             dict(settings).items()}
    cfg = checked_config(values, {})
    return (replay_config(cfg, {}) if cfg.schedule else cfg), values.get("out") is not None


def run(settings: "RunConfig | Mapping | str | Path", *, out: str | Path | None = None, overwrite: bool = False,
        on_progress: OnProgress | None = None) -> "Summary":
    """One run, traffic → scheduler → worker(s) → collector as processes, to its end: its Summary.

    `out` (else the settings' own, else a new runs/<time>-<strategy>-<backend>) must be unused unless
    `overwrite`. Raises ConfigError before anything starts, RunFailed when a role died (the summary is in
    the folder when the collector wrote one), RunTimeout past a limit; KeyboardInterrupt stops every
    process first. A run that lost requests to a fault still returns: see Summary.role_deaths."""
    from batchlab.protocol.settings import refuse_ignored
    from batchlab.runner.launcher import launch_run
    from batchlab.runner.preflight import check_before_start, check_launch
    from batchlab.runner.run_folder import claim, new_folder, release

    cfg, named = run_config(settings)
    refuse_ignored(cfg)  # a setting its backend ignores (another backend's own), as `batchlab run` does
    check_before_start(cfg)
    check_launch(cfg)
    cfg.out = str(out) if out is not None else cfg.out if named else new_folder(cfg)
    claim(cfg.out, overwrite=overwrite)  # this process's until the run ends: a second run into it is refused
    try:
        return launch_run(cfg, on_tick=run_ticker(on_progress, Path(cfg.out)))
    finally:
        release(cfg.out)


def simulate(config: str | Path | None = None, *, on_progress: OnProgress | None = None, processes: int = 1,
             ray: str | None = None, **settings) -> SimulationResult:
    """Strategies × rates in virtual time (no processes, no sleeps), each point written as a live run's
    folder; what `batchlab simulate` does. `config`: a sweep YAML (base: and grid:) or a run's settings
    YAML; `settings` lay RunConfig fields over it (`strategy` and `rate` may be lists, or comma text, and
    replace the grid's; `out` is where it goes, default runs/simulated). A "finished" Event per point."""
    from batchlab.lab.fanout import Fanout
    from batchlab.lab.simulate import plan_simulation, run_simulation

    plan = plan_simulation(None if config is None else str(config), settings)
    view = CallbackView(on_progress)
    results = run_simulation(plan, fanout=Fanout(processes, ray), on_point=lambda point, _summary, elapsed_s:
                             view.finished(point, point.record("done", "", round(elapsed_s, 3))))
    return SimulationResult(plan.out, results)


def tune(settings: "RunConfig | Mapping | str | Path", *, grid: list[str] | None = None, out: str | Path = "results/tune",
         confirm: int = 0, processes: int = 1, ray: str | None = None, on_ranked: Callable[[dict], None] | None = None,
         on_progress: OnProgress | None = None) -> dict:
    """A strategy's knobs searched in the simulator for the highest goodput under the settings' SLOs (one
    schedule for every candidate); with `confirm` K, the best K run live. OUT/tune.json's record: its
    ranked "candidates" (rank, knobs, goodput, latency), the untuned "baseline" and "space" searched.
    `grid`: ["KEY=V1,V2", ...] replaces a knob's default range. ConfigError without an SLO. `on_ranked`:
    the record once searched (before any live run); `on_progress`: a note as each live run starts, its ticks."""
    from batchlab.lab.fanout import Fanout
    from batchlab.lab.tune import run_tune
    from batchlab.protocol.settings import ConfigError
    from batchlab.runner.launcher import launch_run

    cfg, _ = run_config(settings)
    if not cfg.slo:
        raise ConfigError("tune needs an SLO to rank by, e.g. slo: [ttft=500ms, tpot=50ms]")
    if confirm < 0:
        raise ConfigError("confirm must be ≥ 0")
    return run_tune(cfg, grid or [], Path(out), confirm, Fanout(processes, ray), on_ranked=on_ranked,
                    say=CallbackView(on_progress).note,
                    run=lambda live: launch_run(live, on_tick=run_ticker(on_progress, Path(live.out))))


def report(folder: str | Path, *, rate: float | None = None, slos: dict[str, float] | list[str] | None = None,
           out: str | Path | None = None, extra: list[str] | None = None) -> "ReportResult":
    """REPORT.md, REPORT.html and the plots of a sweep's or a run's folder (into `out`, default the folder;
    the runs' own files are only read): where they went, the capacity table's lines and the headlines.
    `slos`: {"ttft": 0.5} in seconds, or ["ttft=500ms", ...]. ReportError (its `lines`, one per file it
    refused) when a file cannot be read; nothing is written then."""
    from batchlab.report.build import parse_slos, run_report

    if isinstance(slos, list):
        slos = parse_slos(slos)
    return run_report(str(folder), rate=rate, slos=slos, out=None if out is None else str(out), extra=extra)
