"""Robust readers for ShareGPT-style conversation files (a JSON array, or JSONL).

The packaged ShareGPT_V3 file is cut off mid-element, so `json.load` fails; the array reader streams
it element by element and stops cleanly at the first element that cannot be completed.
"""
import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CHUNK_BYTES = 1 << 20  # read size for the streaming array parser
_WHITESPACE = " \t\r\n\ufeff"  # a leading byte-order mark counts as blank


@dataclass(slots=True)
class ParseResult:
    """Usable (prompt, reply) pairs from one file, with counts of what was read and skipped."""

    prompts: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    parsed: int = 0  # whole JSON elements / lines decoded
    skipped: int = 0  # elements or lines that were broken or not a human->gpt conversation
    truncated: bool = False  # the array ended early (cut off or broken) and the rest was dropped


def conversation_pair(obj: object) -> tuple[str, str] | None:
    """(first human text, first gpt text) when turn 1 is from "human" and turn 2 from "gpt", else None."""
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or len(turns) < 2 or not all(isinstance(t, dict) for t in turns[:2]):
        return None
    first, second = turns[:2]
    if first.get("from") != "human" or second.get("from") != "gpt":
        return None
    prompt, reply = first.get("value"), second.get("value")
    return (prompt, reply) if isinstance(prompt, str) and isinstance(reply, str) else None


class _ArrayStream:
    """Decode the elements of a top-level JSON array from a file, one at a time."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._json = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self.truncated = False

    def _fill(self) -> bool:
        """Append one chunk to the buffer (dropping consumed text); False at end of file."""
        if self._eof:
            return False
        chunk = self._file.read(CHUNK_BYTES)
        self._eof = not chunk
        self._buf = self._buf[self._pos:] + self._decoder.decode(chunk, final=self._eof)
        self._pos = 0
        return bool(chunk)

    def _skip(self, chars: str) -> str:
        """Skip `chars`, reading more as needed; return the next character ('' at end of file)."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in chars:
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _decode_one(self) -> object:
        """Decode the element at the cursor, reading more until it is whole; StopIteration if it can't be."""
        while True:
            try:
                obj, end = self._json.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                if self._fill():
                    continue
                self.truncated = True
                raise StopIteration from None
            self._pos = end
            return obj

    def __iter__(self) -> Iterator[object]:
        try:
            if self._skip(_WHITESPACE) != "[":
                self.truncated = True
                return
            self._pos += 1
            while (nxt := self._skip(_WHITESPACE + ",")) not in ("", "]"):
                try:
                    yield self._decode_one()
                except StopIteration:
                    return
            self.truncated = nxt == ""
        finally:
            self._file.close()


def _collect(result: ParseResult, obj: object) -> None:
    """Count one decoded element and keep its pair if usable."""
    result.parsed += 1
    pair = conversation_pair(obj)
    if pair is None:
        result.skipped += 1
        return
    result.prompts.append(pair[0])
    result.replies.append(pair[1])


def parse_json_array(path: Path) -> ParseResult:
    """Stream a (possibly truncated) JSON array of conversations."""
    result = ParseResult()
    stream = _ArrayStream(path)
    for obj in stream:
        _collect(result, obj)
    result.truncated = stream.truncated
    return result


def parse_jsonl(path: Path) -> ParseResult:
    """One conversation object per line; blank lines ignored, broken lines skipped and counted."""
    result = ParseResult()
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                result.skipped += 1
                continue
            _collect(result, obj)
    return result


def parse_file(path: Path) -> ParseResult:
    """A JSON array file (first non-blank byte '[') or else JSONL."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return parse_json_array(path) if head.startswith(b"[") else parse_jsonl(path)
