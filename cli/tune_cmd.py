"""`batchlab tune`: search a strategy's knobs in the simulator for the highest goodput under an SLO, then
(with --confirm K) run the best K live on the same schedule and set predicted beside measured.

The search is lab.tune's (through batchlab.api.tune); this command parses and prints.
"""
from pathlib import Path
from typing import Annotated, Optional

from batchlab.cli.grammar import Processes, RayAddress
from batchlab.cli.options import ConfigOpt, Opt, with_settings
from batchlab.lab.tune import COMPARED, TUNE_FOLDER, knobs_text as _knobs_text, value_text as _value

Grid = Annotated[Optional[list[str]], Opt("--grid", help="KEY=V1,V2,...: the values to search for one knob "
                                                         "(repeatable; replaces its default range)")]
Confirm = Annotated[int, Opt("--confirm", help="run the best K live on --backend; predicted vs measured")]
Out = Annotated[str, Opt("--out", help="output folder")]
Top = Annotated[int, Opt("--top", help="rows of the ranked table to print (all are in OUT/tune.csv)")]


@with_settings("strategy", "strategy_args", "slo", "rate", "duration_s", "dataset", "prompt_lengths", "output_lengths",
               "max_new_tokens", "preset", "seed", "backend", "model")
def tune(*, overrides: dict, config: ConfigOpt = None, grid: Grid = None, confirm: Confirm = 0, out: Out = TUNE_FOLDER,
         top: Top = 20, processes: Processes = 1, ray: RayAddress = None) -> None:
    """Search a strategy's knobs in the simulator for the highest goodput under --slo (comma list or
    repeated); --confirm K runs the best K live and prints predicted vs measured."""
    from batchlab import api
    from batchlab.cli.live import RunsStatus

    cfg = api.run_config(config or {}, **overrides)  # the live confirmations' view, checked once
    with RunsStatus(cfg) as status:  # each live confirmation's progress
        result = api.tune(cfg, out, knobs=grid, confirm=confirm, processes=processes, ray=ray,
                          on_ranked=lambda r: _print_ranked(r.record, top, Path(out)), on_progress=status)
    if confirm:
        _print_confirm(result.confirm)


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _shown(metric: str, value: float | None) -> str:
    return _num(value, {"goodput": ".1%", "throughput_tok_s": ".1f"}.get(metric, ".3f"))


def _print_ranked(record: dict, top: int, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console, knobs = Console(width=160), list(record["space"])
    slos = ", ".join(f"{k}≤{v * 1000:g}ms" for k, v in record["slos"].items())
    rows = record["candidates"]
    table = Table("rank", *knobs, "goodput", "TTFT p50 s", "TTFT p99 s", "TPOT p50 s", "E2E p99 s", "tok/s",
                  title=f"{record['strategy']}: {len(rows)} candidates simulated, goodput under {slos}",
                  caption=f"all candidates in {out / 'tune.csv'} and {out / 'tune.json'}")
    for r in rows[:top]:
        table.add_row(str(r["rank"]), *(_value(r["knobs"][k]) for k in knobs),
                      _num(r["goodput"], ".1%"), _num(r["ttft_p50_s"]), _num(r["ttft_p99_s"]), _num(r["tpot_p50_s"]),
                      _num(r["e2e_p99_s"]), _num(r["throughput_tok_s"], ".0f"))
    console.print(table)
    base = record["baseline"]
    console.print(f"untuned ({_knobs_text(base['knobs'])}): goodput {_num(base['goodput'], '.1%')}; "
                  f"held: {_knobs_text(record['held'])}", highlight=False)
    for note in record["notes"]:
        console.print(f"note: {note}", highlight=False)


def _print_confirm(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("rank", "knobs", "metric", "predicted", "measured", "error", title="simulated vs live")
    for r in rows:
        for i, (metric, name) in enumerate(COMPARED):
            table.add_row(str(r["rank"]) if i == 0 else "", _knobs_text(r["knobs"]) if i == 0 else "", name,
                          _shown(metric, r["predicted"][metric]), _shown(metric, r["measured"][metric]),
                          _num(r["rel_error"][metric], "+.1%"))
    Console(width=160).print(table)
