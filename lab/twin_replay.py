"""A live run replayed on a twin: the run's own settings and the very schedule it sent, played in virtual time
on a twin's preset (lab.twin), so the twin and the live run can be set side by side request by request."""
from pathlib import Path


def replayed(folder: Path, preset: Path):
    """(the simulated run's tables (collector.tables.Tables), its RunConfig) for a live run folder on `preset`."""
    import yaml

    from batchlab.protocol.run_dir import RunDir
    from batchlab.runner.preflight import checked_config
    from batchlab.simulator.run import simulate
    from batchlab.traffic.schedule import load_schedule

    settings = yaml.safe_load(RunDir(folder).config.read_text()) or {}
    cfg = checked_config({**settings, "out": ".", "preset": str(preset), "schedule": ""}, {})
    return simulate(cfg, load_schedule(RunDir(folder).schedule)), cfg
