"""The model folders built here: tiny-mistral, the embedded default model (Mistral-7B's tokenizer, a
scaled-down Mistral, seeded weights), and `NAME:random`'s config + tokenizer folder (models.archs, no weights).

Each is built once into the cache (`$BATCHLAB_HOME/models/`, else `~/.cache/batchlab/models/`) with
`save_pretrained`, then always loaded with `from_pretrained` like any other model. Nothing is downloaded:
the tokenizer comes from the `mistral_common` package and the weights from `torch.manual_seed(TINY_SEED)`.
"""
import json
import os
import shutil
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from batchlab.models.archs import TINY_MISTRAL, Arch, hf_config, random_arch
from batchlab.models.tokenizers import hf_tokenizer_from_sentencepiece, mistral_tokenizer_file

TINY_SEED = 0
TINY_FORMAT = 1  # bump when the recipe changes; an older folder is then rebuilt
MARKER_FILE = "batchlab-tiny.json"
RANDOM_FORMAT = 1  # bump when the `NAME:random` folder recipe changes; an older folder is then rebuilt
RANDOM_MARKER_FILE = "batchlab-random.json"
# Mistral-7B's shape scaled down: ~56M parameters (2 × 16.4M embeddings + 8 × 2.95M per layer).
TINY_SHAPE: dict[str, int | float] = {
    "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
}


def cache_home(home: str | None = None) -> Path:
    """`home`, else $BATCHLAB_HOME, else ~/.cache/batchlab."""
    home = home or os.environ.get("BATCHLAB_HOME") or str(Path.home() / ".cache" / "batchlab")
    return Path(home).expanduser()


def tiny_mistral_dir(home: str | None = None) -> Path:
    """Where tiny-mistral lives (it may not exist yet)."""
    return cache_home(home) / "models" / TINY_MISTRAL


def tiny_config():
    """The MistralConfig of tiny-mistral (no sliding window, untied embeddings)."""
    from transformers import MistralConfig

    return MistralConfig(**TINY_SHAPE, sliding_window=None, tie_word_embeddings=False, dtype="float32")


def build_tiny_model(seed: int = TINY_SEED):
    """A freshly initialised tiny-mistral (float32, eval mode); the same seed gives the same weights."""
    import torch
    from transformers import MistralForCausalLM

    torch.manual_seed(seed)
    return MistralForCausalLM(tiny_config()).eval()


def _is_complete(folder: Path, marker_file: str, stamp: str) -> bool:
    marker = folder / marker_file
    return marker.is_file() and stamp in marker.read_text()


def _swap_in(tmp: Path, final: Path, force: bool, is_complete: Callable[[Path], bool]) -> None:
    """Rename `tmp` to `final`; with force, an existing `final` is moved aside and removed."""
    if force and final.exists():
        trash = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:  # someone else finished first (or left an old folder): theirs wins unless broken
        if is_complete(final):
            shutil.rmtree(tmp, ignore_errors=True)
            return
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)


def make_model_folder(final: Path, save: Callable[[Path], None], marker_file: str, marker: dict,
                      force: bool = False) -> Path:
    """Create a model folder unless a complete one (its marker file holds the same format) is there:
    `save(folder)` writes the model (weights and generation config) or its config, then the tokenizer and the
    marker (`marker` as JSON) follow.

    Written into a temporary sibling folder and renamed at the end, so a killed or concurrent
    creation never leaves a half-written model where loaders look.
    """
    complete = partial(_is_complete, marker_file=marker_file, stamp=f'"format": {marker["format"]}')
    if complete(final) and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        save(tmp)
        hf_tokenizer_from_sentencepiece(mistral_tokenizer_file()).save_pretrained(tmp)
        (tmp / marker_file).write_text(json.dumps(marker) + "\n")
        _swap_in(tmp, final, force, complete)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def make_tiny_mistral(home: str | None = None, force: bool = False) -> Path:
    """Create tiny-mistral in the cache unless it is already there; returns its folder."""
    return make_model_folder(tiny_mistral_dir(home), lambda folder: build_tiny_model().save_pretrained(folder),
                             MARKER_FILE, {"format": TINY_FORMAT, "seed": TINY_SEED}, force)


def random_dir(arch: Arch, home: str | None = None) -> Path:
    """Where `NAME:random`'s folder (config + tokenizer, no weights) lives; it may not exist yet."""
    return cache_home(home) / "models" / f"{arch.name}-random"


def make_random_dir(arch: Arch, home: str | None = None, force: bool = False) -> Path:
    """Create `NAME:random`'s folder (config.json + tokenizer files, no weights) unless it is there."""
    return make_model_folder(random_dir(arch, home), lambda folder: hf_config(arch).save_pretrained(folder),
                             RANDOM_MARKER_FILE, {"format": RANDOM_FORMAT, "arch": arch.name}, force)


def resolve_model(name: str) -> str:
    """tiny-mistral → its folder (created on first use); `NAME:random` → its config + tokenizer folder
    (models.archs, no weights); any other hub id or path unchanged."""
    if name == TINY_MISTRAL:
        return str(make_tiny_mistral())
    arch = random_arch(name)
    if arch is not None:
        return str(make_random_dir(arch))
    return name
