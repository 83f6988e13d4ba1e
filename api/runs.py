"""The API's one-run jobs: run (live processes), tune (a knob search in the simulator), calibrate (a step model
fitted to measured steps), report (REPORT.md from run folders) and load (a folder's runs, to analyse). Every
input is checked here, at the API's edge: settings are a RunConfig, a mapping or a YAML file's path (ConfigError
for anything else), and `**changes` are settings laid over them. Heavy imports happen inside the functions:
importing the API is cheap and starts nothing."""
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from batchlab.protocol.outcomes import RunOutcome
from batchlab.api.guard import refuse_unguarded_main
from batchlab.api.progress import CallbackView, OnProgress, run_ticker
from batchlab.api.results import PointRecord, RunResult, SweepResult, TuneResult
from batchlab.protocol.errors import ConfigError, shown, term

if TYPE_CHECKING:
    from batchlab.api.calibration import CalibrateResult
    from batchlab.collector.summary import Summary
    from batchlab.protocol.settings import RunConfig
    from batchlab.protocol.study_settings import CalibrateSettings
    from batchlab.report.build import Report

def run_config(settings: "RunConfig | Mapping | str | Path", **changes) -> "RunConfig":
    """A run's settings checked as `batchlab run` checks them (ConfigError naming the setting): a RunConfig, a
    mapping of settings ({}: the defaults) or a YAML file of them (what --config reads), with `changes` laid
    over them (None: not given). Which settings were given stays known (a strategy's own defaults hold for the
    rest); a strategy may be the class itself; a replayed schedule brings its own traffic settings."""
    from batchlab.protocol.plugins import from_code
    from batchlab.protocol.settings import RunConfig, load_yaml
    from batchlab.runner.config import replay_config
    from batchlab.runner.preflight import checked_config

    if isinstance(settings, RunConfig) and settings.checked() and not any(v is not None for v in changes.values()):
        return settings.model_copy()  # run_config's own result again (`batchlab run`'s): checked once, not twice
    if isinstance(settings, RunConfig):
        values = settings.model_dump(include=settings.model_fields_set)
        if settings.strategy_code():  # the class itself again: its code is carried anew
            values["strategy"] = from_code(settings.strategy_code())
            values.pop("strategy_sha256", None)
    elif isinstance(settings, (str, Path)):
        values = load_yaml(settings)
    elif isinstance(settings, Mapping):
        values = {str(k).replace("-", "_"): v for k, v in settings.items()}
    else:
        raise ConfigError(f"settings are a RunConfig, a mapping of settings ({{}}: the defaults) or a YAML file's "
                          f"path, not {shown(settings)}")
    overrides = {str(k).replace("-", "_"): v for k, v in changes.items()}
    cfg = checked_config(values, overrides)
    return (replay_config(cfg, overrides) if cfg.schedule else cfg).mark_checked()


def run(settings: "RunConfig | Mapping | str | Path", out: str | Path | None = None, *,
        overwrite: bool = False, on_progress: OnProgress | None = None, save_result: str | Path | None = None,
        save_detailed: bool = False, **changes) -> RunResult:
    """One run, traffic → scheduler → worker(s) → collector as processes, to its end: its Summary, as a
    RunResult (its tables too: result.requests(), ...). `settings` as run_config takes them, `changes` laid
    over them (e.g. strategy=MyStrategy, rate=20).

    `out` (else the settings' own, else a new runs/<time>-<strategy>-<backend>) must be unused unless
    `overwrite`. Progress: a "start" Event naming the folder, then ticks. Raises ConfigError before anything
    starts, RunFailed when a role died (the summary is in the folder when the collector wrote one), RunTimeout
    past a limit; KeyboardInterrupt stops every process first. A run that lost requests to a fault still
    returns: see Summary.role_deaths. `save_result`: a JSON file to write the run's figures into as well, under
    vllm bench serve's result keys and units (checked before the run starts); `save_detailed`: with it, each
    request's lengths, TTFT, token gaps, start time and generated text too."""
    refuse_unguarded_main()
    from batchlab.protocol.settings import refuse_ignored
    from batchlab.runner.launcher import launch_run
    from batchlab.runner.preflight import check_before_start, check_launch
    from batchlab.runner.run_folder import claim, new_folder, release

    cfg = run_config(settings, **changes)
    refuse_ignored(cfg)  # a setting its backend ignores (another backend's own), as `batchlab run` does
    check_before_start(cfg)
    check_launch(cfg, None if save_result is None else _result_file(save_result))
    cfg.out = str(out) if out is not None else cfg.out if "out" in cfg.model_fields_set else new_folder(cfg)
    claim(cfg.out, overwrite=overwrite)  # this process's until the run ends: a second run into it is refused
    try:
        CallbackView(on_progress).started(1, Path(cfg.out))
        result = RunResult.of(launch_run(cfg, on_tick=run_ticker(on_progress, Path(cfg.out))))
    finally:
        release(cfg.out)
    if save_result is not None:
        _save_result(result, cfg, str(save_result), save_detailed)
    return result


def _result_file(save_result: object) -> str:
    """run's save_result as a path's text; ConfigError for anything else."""
    if not isinstance(save_result, (str, Path)):
        raise ConfigError(f"{term('--save-result', 'save_result')} is a file's path, not {shown(save_result)}")
    return str(save_result)


def _save_result(result: RunResult, cfg: "RunConfig", path: str, detailed: bool) -> None:
    """The run's figures under vllm bench serve's result keys (collector.vllm_result), its texts when `detailed`."""
    from batchlab.collector.vllm_result import save_result as write_result
    from batchlab.models.tokenizers import decoder

    decode, why_not = decoder(cfg.model) if detailed else (None, "")  # generated_texts
    write_result(str(result.folder), path, detailed, decode, why_not)


def tune(settings: "RunConfig | Mapping | str | Path", out: str | Path | None = None, *,
         knobs: Mapping[str, list] | list[str] | None = None, confirm: int = 0, processes: int = 1,
         ray: str | None = None, on_ranked: Callable[[TuneResult], None] | None = None,
         on_progress: OnProgress | None = None, **changes) -> TuneResult:
    """A strategy's knobs searched in the simulator for the highest goodput under the settings' SLOs (one
    schedule for every candidate); with `confirm` K, the best K run live on the same schedule. `settings` and
    `changes` as run takes them (one strategy at one rate; a plan of one entry and one rate too). `knobs`:
    {"max_batch_size": [2, 8]} (or ["max_batch_size=2,8"]) replaces a knob's default range. ConfigError
    without an SLO. `out`: default results/tune. `on_ranked`: the result once searched (before any live run);
    `on_progress`: a note as each live run starts, its ticks. OUT/tune.json holds the record."""
    refuse_unguarded_main()
    from batchlab.lab.fanout import Fanout
    from batchlab.lab.tune import TUNE_FOLDER, run_tune
    from batchlab.protocol.files import output_folder
    from batchlab.runner.launcher import launch_run

    cfg = run_config(_one_run(settings), **changes)
    if not cfg.slo:
        example = term("--slo ttft=500ms,tpot=50ms", "slo=['ttft=500ms', 'tpot=50ms']")
        raise ConfigError(f"tune needs an SLO to rank by, e.g. {example}")
    if not isinstance(confirm, int) or isinstance(confirm, bool) or confirm < 0:
        raise ConfigError(f"{term('--confirm', 'confirm')} must be a whole number ≥ 0, got {confirm!r}")
    out = output_folder(TUNE_FOLDER if out is None else out)
    record = run_tune(cfg, _knob_items(knobs), out, confirm, Fanout(processes, ray),
                      on_ranked=None if on_ranked is None else (lambda r: on_ranked(TuneResult.of(out, r))),
                      say=CallbackView(on_progress).note,
                      run=lambda live: launch_run(live, on_tick=run_ticker(on_progress, Path(live.out))))
    return TuneResult.of(out, record)


def _one_run(settings: object) -> object:
    """A plan of one strategy at one rate as that run's settings (tune searches one run's knobs)."""
    from batchlab.lab.sweep_plan import Plan

    if not isinstance(settings, Plan) and not (isinstance(settings, Mapping) and settings and
                                               set(settings) <= {"base", "grid"}):
        return settings
    from batchlab.lab.sweep_plan import Point, plan_from

    plan, _ = plan_from(settings)
    if len(plan.entries) != 1 or len(plan.rates) != 1:
        raise ConfigError(f"tune searches one strategy at one rate; the plan has {len(plan.entries)} strategies "
                          f"and {len(plan.rates) or 'automatic'} rates")
    return Point(plan.entries[0], plan.rates[0], 0, plan.seed, Path(".")).config(plan.base)


def _knob_items(knobs: object) -> list[str]:
    """tune's knobs as lab.tune reads them (["KEY=V1,V2", ...]); ConfigError for anything else."""
    if knobs is None:
        return []
    if isinstance(knobs, Mapping):
        return [f"{k}={','.join(map(str, v if isinstance(v, (list, tuple)) else [v]))}" for k, v in knobs.items()]
    if isinstance(knobs, (list, tuple)) and all(isinstance(k, str) for k in knobs):
        return list(knobs)
    raise ConfigError(f"knobs are a mapping (knob → values to search) or ['KNOB=V1,V2', ...], not {shown(knobs)}")


def calibrate(settings: "CalibrateSettings | Mapping | str | Path | None" = None, out: str | Path | None = None, *,
              runs: list | None = None, on_progress: OnProgress | None = None, **changes) -> "CalibrateResult":
    """A step-model preset fitted and written to `out` (a .yaml, usable wherever a preset name is): measured
    over a grid on a warm backend in this process, or, with `runs` (run or sweep folders, or results of run,
    sweep, simulate, load), fitted to the steps their live workers executed. `settings`: `batchlab calibrate`'s
    (protocol.study_settings.CalibrateSettings, a mapping of them or a YAML file), `changes` laid over them.
    A note Event per line the command prints."""
    refuse_unguarded_main()
    from batchlab.api.calibration import run_calibration

    return run_calibration(settings, out, runs, CallbackView(on_progress), changes)


def report(folder: str | Path, *, rate: float | None = None, slos: dict[str, float] | list[str] | None = None,
           out: str | Path | None = None, extra: list[str] | None = None) -> "Report":
    """REPORT.md, REPORT.html and the plots of a sweep's or a run's folder (into `out`, default the folder;
    the runs' own files are only read): where they went, the capacity table's lines and the headlines.
    `slos`: {"ttft": 0.5} in seconds, or ["ttft=500ms", ...]. ReportError (its `lines`, one per file it
    refused) when a file cannot be read; nothing is written then. ConfigError for an argument that is none."""
    refuse_unguarded_main()
    from batchlab.protocol.files import output_folder
    from batchlab.report.build import checked_slos, run_report

    if not isinstance(folder, (str, Path)):
        raise ConfigError(f"a report's folder is a path, not {shown(folder)}")
    if rate is not None and not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0):
        raise ConfigError(f"{term('--rate', 'rate')} must be a number of requests/s > 0, got {rate!r}")
    if out is not None:
        output_folder(out)
    return run_report(str(folder), rate=rate, slos=checked_slos(slos), out=None if out is None else str(out),
                      extra=None if extra is None else [str(e) for e in _paths(extra, "extra")])


def _paths(items: object, name: str) -> list[str | Path]:
    """A list of paths (one path alone too); ConfigError for anything else."""
    items = [items] if isinstance(items, (str, Path)) else items
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, (str, Path)) for i in items):
        raise ConfigError(f"{name} is a list of paths, not {shown(items)}")
    return list(items)


def load(folder: str | Path) -> SweepResult:
    """The runs a folder holds, to analyse: a sweep's (its points, as sweep and simulate return them), one run's,
    or any folder's run folders (a point each). ReportError when it holds none or its index is unreadable."""
    import json

    from batchlab.collector.layout import INDEX_FILE
    from batchlab.collector.reading import run_folders
    from batchlab.collector.summary import read_summary
    from batchlab.protocol.errors import ReportError

    if not isinstance(folder, (str, Path)):
        raise ConfigError(f"a folder is a path, not {shown(folder)}")
    root = Path(folder)
    if (root / INDEX_FILE).is_file():
        try:
            return SweepResult.of(root, json.loads((root / INDEX_FILE).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{root / INDEX_FILE}: not a batchlab sweep index ({type(exc).__name__}: "
                              f"{exc})") from None
    records = [_run_record(f, read_summary(f)) for f in run_folders(root)]
    if not records:
        raise ReportError(f"{root} holds no run (no summary.json and no {INDEX_FILE})")
    return SweepResult(root, records)


def _run_record(folder: Path, summary: "Summary") -> PointRecord:
    """A lone run's folder as a point."""
    s = summary.settings
    concurrency = s.get("concurrency") if isinstance(s.get("concurrency"), int) else 0
    rate = None if concurrency else s.get("rate")
    return PointRecord(str(s.get("label") or s.get("strategy") or ""), str(s.get("strategy") or ""),
                       str(s.get("backend") or ""), None if rate is None else float(rate), concurrency,
                       int(s.get("repeat") or 0), int(s.get("seed") or 0), folder, RunOutcome.DONE)

