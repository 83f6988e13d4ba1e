"""The model's tokenizer, for the traffic process (prompts are tokenized once, there), and the files
models.folders writes next to a model built here."""
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from batchlab.models.archs import TINY_MISTRAL, random_arch


def mistral_tokenizer_file() -> Path:
    """Mistral-7B v0.1's SentencePiece model, shipped inside the mistral_common package
    (or the file named by $BATCHLAB_MISTRAL_TOKENIZER, for hosts without that package)."""
    if os.environ.get("BATCHLAB_MISTRAL_TOKENIZER"):
        return Path(os.environ["BATCHLAB_MISTRAL_TOKENIZER"])
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall mistral_common")
    return path


def hf_tokenizer_from_sentencepiece(model_file: Path):
    """A transformers tokenizer that encodes exactly like SentencePiece's BPE on `model_file`.

    transformers 5 converts a `tokenizer.model` with merges ranked by piece id, not by score, and a
    Metaspace that skips the dummy prefix before a leading space: Mistral's whitespace-only pieces
    (ids 259..., score -1e9) then merge too early and leading spaces are lost. Here the merges are
    ranked by score, the dummy prefix is always added (SentencePiece's `add_dummy_prefix`), and text
    is split into words like SentencePiece's `SplitIntoWords` (a run of spaces starts a word).
    Literal "<s>"/"</s>" in text stay text (`split_special_tokens`), as in SentencePiece.
    Proven equal on ShareGPT text by tests/test_tiny_tokenizer.py.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import import_protobuf
    from transformers.tokenization_utils_base import generate_merges

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    scores = {p.piece: p.score for p in proto.pieces if p.type == 1}  # NORMAL pieces only
    tok = Tokenizer(models.BPE(vocab=vocab, merges=generate_merges(vocab, scores), unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\u2581+[^\u2581]*"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   split_special_tokens=True, add_bos_token=True, add_eos_token=False)


class SentencePieceTokenizer:
    """encode(text) → ids with SentencePiece itself (no BOS), the reference for tiny-mistral."""

    def __init__(self, model_file: Path) -> None:
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.vocab_size = self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return self.sp.encode(text, out_type=int)

    def decode(self, ids: list[int]) -> str:
        """The text of token ids (control tokens dropped, as a server streams it)."""
        return self.sp.decode([i for i in ids if 0 <= i < self.vocab_size])


class HFTokenizer:
    """encode(text) → ids through transformers' AutoTokenizer (no special tokens)."""

    def __init__(self, name_or_path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(name_or_path)
        self.vocab_size = len(self.tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """The text of token ids (special tokens dropped, as a server streams it)."""
        return self.tok.decode([i for i in ids if 0 <= i < self.vocab_size], skip_special_tokens=True)


@lru_cache(maxsize=4)
def get_tokenizer(model: str):
    """tiny-mistral and `NAME:random` (models.archs) → SentencePiece on Mistral's file; anything else →
    AutoTokenizer (hub id or path)."""
    if model == TINY_MISTRAL or random_arch(model) is not None:
        return SentencePieceTokenizer(mistral_tokenizer_file())
    return HFTokenizer(model)


def decoder(model: str) -> tuple[Callable[[list[int]], str] | None, str]:
    """The model's token-ids → text, or None and why (a tokenizer that cannot be loaded here)."""
    try:
        return get_tokenizer(model).decode, ""
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        return None, f"the tokenizer of {model!r} could not be loaded ({type(exc).__name__}: {exc})"
