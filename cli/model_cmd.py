"""`batchlab model ...`: the embedded default model."""
from typing import Annotated, Optional

import typer

model_app = typer.Typer(no_args_is_help=True, help="Manage the embedded default model (tiny-mistral).")


@model_app.command("make-tiny")
def make_tiny(*, force: Annotated[bool, typer.Option(help="rebuild even if it exists")] = False,
              home: Annotated[Optional[str], typer.Option(help="cache folder (default $BATCHLAB_HOME)")] = None
              ) -> None:
    """Create tiny-mistral (Mistral-7B's tokenizer, a scaled-down Mistral, seeded weights) in the cache."""
    from worker.tiny import make_tiny_mistral

    path = make_tiny_mistral(home=home, force=force)
    typer.echo(f"tiny-mistral is at {path}")
