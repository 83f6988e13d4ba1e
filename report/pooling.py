"""Which runs belong together: repeats of one point only when their configurations are equal but for
the seed, one curve only when they are equal but for seed and rate (protocol.identity).

A folder of loose runs (no sweep index) that share a label but differ in anything else is split into
separate curves, each labelled with the settings that tell them apart; a sweep whose points differ
within one label (data measured under another configuration) is refused, naming the keys.
"""
import json

from batchlab.protocol.outcomes import RunOutcome
from batchlab.protocol.errors import PoolingError
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.identity import differences, identity

CURVE_FREE = frozenset({"seed", "rate", "concurrency"})  # what may differ along one strategy's curve
LABEL_KEYS_SHOWN = 3  # distinguishing settings put into a split label
USABLE_STATUSES = (RunOutcome.DONE, RunOutcome.STOPPED)  # run.json statuses of a run that measured what it planned


def curve_key(settings: dict) -> str:
    """The identity less seed and the load level (rate, or closed loop's clients), as one comparable
    text; open and closed loop stay apart (a curve has one kind of load axis)."""
    key = {k: v for k, v in identity(settings).items() if k not in CURVE_FREE}
    key["closed_loop"] = bool(settings.get("concurrency"))
    return json.dumps(key, sort_keys=True)


def unusable(folder) -> str | None:
    """Why a run folder's data is not a finished measurement (run.json's status), else None; a run
    written before run.json existed is taken as it is."""
    try:
        record = json.loads(RunDir(folder).run.read_text())
    except (OSError, ValueError):
        return None
    status = record.get("status") if isinstance(record, dict) else None
    if status in USABLE_STATUSES or status is None:
        return None
    if status == RunOutcome.RUNNING:
        return "incomplete: its run.json still says running (the launcher was killed, or it is still going)"
    return f"the run {status}" + (f": {record['reason']}" if record.get("reason") else "")


def _mixed(runs: list) -> dict[str, list[list]]:
    """label → its runs grouped by configuration (curve key), for the labels with more than one."""
    by_label: dict[str, dict[str, list]] = {}
    for run in runs:
        by_label.setdefault(run.label, {}).setdefault(curve_key(run.settings), []).append(run)
    return {label: list(by_key.values()) for label, by_key in by_label.items() if len(by_key) > 1}


def _distinguishing(groups: list[list]) -> list[str]:
    """The identity keys whose values differ between the groups (first run of each)."""
    keys: set[str] = set()
    first = groups[0][0].settings
    for other in groups[1:]:
        keys |= {d.split(" ", 1)[0] for d in differences(first, other[0].settings, ignore=CURVE_FREE)}
    return sorted(keys)


def split_mixed(runs: list) -> None:
    """Loose runs: a label whose runs differ (beyond seed and rate) becomes one label per configuration,
    e.g. 'dynamic (preset=a100-llama2-7b)' and 'dynamic (preset=3090-mistral-7b)'."""
    for label, groups in _mixed(runs).items():
        keys = _distinguishing(groups)[:LABEL_KEYS_SHOWN]
        for group in groups:
            ident = identity(group[0].settings)
            suffix = ", ".join(f"{k}={ident.get(k)}" for k in keys)
            for run in group:
                run.label = f"{label} ({suffix})"


def refuse_mixed(runs: list) -> None:
    """A sweep: every label's points must share one configuration but for seed and rate."""
    for label, groups in _mixed(runs).items():
        first, other = groups[0][0], groups[1][0]
        diffs = differences(first.settings, other.settings, ignore=CURVE_FREE)
        raise PoolingError(f"the points labelled {label} were measured with different configurations "
                           f"({first.folder} vs {other.folder}: {'; '.join(diffs) or 'open against closed loop'}); rerun the sweep (it "
                           "reruns points whose configuration changed) or report them separately")
