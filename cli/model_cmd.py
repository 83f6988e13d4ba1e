"""`batchlab model ...`: the embedded default model."""
from typing import Annotated, Optional

import typer

from batchlab.cli.options import with_settings
from batchlab.protocol.setting_groups import WorkerSettings, default_of

model_app = typer.Typer(no_args_is_help=True, help="Manage the embedded default model (tiny-mistral).")


@model_app.command("make-tiny")
def make_tiny(*, force: Annotated[bool, typer.Option(help="rebuild even if it exists")] = False,
              home: Annotated[Optional[str], typer.Option(help="cache folder (default $BATCHLAB_HOME)")] = None
              ) -> None:
    """Create tiny-mistral (Mistral-7B's tokenizer, a scaled-down Mistral, seeded weights) in the cache."""
    from batchlab.models.folders import make_tiny_mistral

    path = make_tiny_mistral(home=home, force=force)
    typer.echo(f"tiny-mistral is at {path}")


@model_app.command("serve-command")
@with_settings("dtype")  # the run's --dtype, as the worker takes it
def serve_command(model: Annotated[str, typer.Argument(help="NAME:random (mistral-7b-v0.1, tinyllama-1.1b, "
                                                             "llama-2-7b) or tiny-mistral")], *, overrides: dict,
                  port: Annotated[int, typer.Option(help="the server's port")] = 8000) -> None:
    """Print the command that starts a vLLM OpenAI server on this model without weights to download
    (random weights: vLLM's dummy load format), for `batchlab run --backend openai --endpoint ...`."""
    from batchlab.models.archs import random_arch
    from batchlab.models.folders import resolve_model

    dtype = overrides["dtype"] or default_of(WorkerSettings, "dtype")
    arch = random_arch(model)
    folder = resolve_model(model)
    words = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--served-model-name",
             model, "--dtype", dtype, "--port", str(port)]
    if arch is not None:
        words += ["--load-format", "dummy"]  # the folder holds config.json and the tokenizer, no weights
    typer.echo(" ".join(words))
    typer.echo(f"then: batchlab run --backend openai --endpoint http://127.0.0.1:{port}/v1 --model {model}", err=True)
