"""A short live status line while a run goes (rich)."""
from rich.console import Console
from rich.live import Live
from rich.text import Text

from batchlab.protocol.settings import RunConfig
from batchlab.cli.launcher import launch_run


def run_with_status(cfg: RunConfig) -> dict:
    """launch_run with a one-line rich status: elapsed vs planned traffic, and which roles are alive."""
    console = Console(stderr=True)
    if not console.is_terminal:
        return launch_run(cfg)
    with Live(Text(""), console=console, refresh_per_second=4, transient=True) as live:
        def tick(elapsed_s: float, alive: dict[str, bool]) -> None:
            roles = " ".join(f"{n}{'' if a else '✓'}" for n, a in alive.items())
            live.update(Text(f"{cfg.strategy}/{cfg.backend} λ={cfg.rate:g} req/s  "
                             f"{elapsed_s:5.1f}s of ~{cfg.duration_s:g}s  [{roles}]"))

        return launch_run(cfg, on_tick=tick)
