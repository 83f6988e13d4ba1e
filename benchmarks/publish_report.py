"""Publish a report as a results page: `python benchmarks/publish_report.py results/cpu make-run-cpu`
copies REPORT.md and its plots into docs/results/NAME/ under a header naming the machine, the date
and the commit the runs recorded (never the machine that publishes). Nothing is edited by hand."""
import argparse
import json
import shutil
from pathlib import Path

from batchlab.collector.summary import read_summary
from batchlab.protocol.run_dir import RUN_FILE, RunDir
from batchlab.report.setup import cpu_model, gpu_name, recorded_environment

DOCS = Path(__file__).resolve().parent.parent / "docs" / "results"


def provenance(folder: Path) -> str:
    """'2-core AMD EPYC …, no GPU; runs 2026-12-01T10:00Z–…; batchlab 0.1.0 (commit abc)' from the runs."""
    starts, commits, settings = [], set(), {}
    for run_json in sorted(folder.rglob(RUN_FILE)):
        record = json.loads(run_json.read_text())
        starts.append(record.get("started_utc", ""))
        commits.add((record.get("batchlab") or {}).get("commit") or "unknown")
        if not settings and RunDir(run_json.parent).summary.is_file():
            settings = read_summary(run_json.parent).settings
    env = recorded_environment(settings)
    machine = f"{cpu_model(settings)}, {env.get('cpu_count', '?')} CPU cores, GPU: {gpu_name(settings) or 'none'}"
    when = f"{min(starts)} to {max(starts)}" if starts else "unknown dates"
    return f"Machine: {machine}. Runs started {when} (UTC). batchlab commit(s): {', '.join(sorted(commits))}."


def publish(folder: Path, name: str, header: str | None = None, docs: Path = DOCS) -> Path:
    """docs/results/NAME/README.md (the report under its provenance, or under `header`) with the report's plots
    beside it. The report's own mentions of the folder's path on this machine become its name."""
    target = docs / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for plot in folder.glob("*.png"):
        shutil.copy2(plot, target / plot.name)
    body = (folder / "REPORT.md").read_text()
    for path in sorted({str(folder.resolve()), str(folder.absolute()), str(folder)}, key=len, reverse=True):
        if "/" in path:  # a path, never a bare name that could occur in the text
            body = body.replace(path, folder.name)
    page = target / "README.md"
    head = header or f"Generated from `{folder.name}` by benchmarks/publish_report.py. {provenance(folder)}"
    page.write_text(f"> {head}\n\n{body}")
    return page


def main() -> None:
    """Command line: the report folder and the page's name."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path, help="a folder `batchlab report` wrote REPORT.md into")
    parser.add_argument("name", help="the page's folder under docs/results/")
    args = parser.parse_args()
    print(publish(args.folder, args.name))


if __name__ == "__main__":
    main()
