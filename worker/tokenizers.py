"""The model's tokenizer, for the traffic process (prompts are tokenized once, there)."""
from functools import lru_cache
from pathlib import Path

TINY_MISTRAL = "tiny-mistral"


def mistral_tokenizer_file() -> Path:
    """Mistral-7B v0.1's SentencePiece model, shipped inside the mistral_common package."""
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall mistral_common")
    return path


class SentencePieceTokenizer:
    """encode(text) → ids with SentencePiece itself (no BOS), the reference for tiny-mistral."""

    def __init__(self, model_file: Path) -> None:
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.vocab_size = self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return self.sp.encode(text, out_type=int)


class HFTokenizer:
    """encode(text) → ids through transformers' AutoTokenizer (no special tokens)."""

    def __init__(self, name_or_path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(name_or_path)
        self.vocab_size = len(self.tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return self.tok.encode(text, add_special_tokens=False)


@lru_cache(maxsize=4)
def get_tokenizer(model: str):
    """tiny-mistral → SentencePiece on Mistral's file; anything else → AutoTokenizer (hub id or path)."""
    if model == TINY_MISTRAL:
        return SentencePieceTokenizer(mistral_tokenizer_file())
    return HFTokenizer(model)
