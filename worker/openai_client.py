"""The `openai` backend: streams `/v1/completions` from a running server (vLLM, TGI, SGLang, llama.cpp …).

Each request is one streamed completion on a thread of a pool bounded by --max-concurrency; every chunk
is stamped on receipt and handed to `step()` through a queue, one chunk per step.

Token-count rule (the OpenAI stream carries text, not tokens), per chunk, first that applies:
  1. the choice carries `token_ids` (vLLM `return_token_ids`): exactly those ids;
  2. the chunk carries `usage.completion_tokens` (vLLM/SGLang `continuous_usage_stats`): the increase
     since the previous chunk, ids -1;
  3. otherwise one token per chunk with non-empty text, id -1 — a guess, so such chunks are held back
     until the final usage report and then corrected: a shortfall is added to the last chunk, an excess
     is taken from the latest chunks.
The emitted total always equals the final `usage.completion_tokens` (or the counted total when the
server sends no usage). A request whose total differs from its output_len fails with the reason.
"""
import json
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from batchlab.protocol.clock import now
from batchlab.worker.backend import BackendError, BackendInfo, Row, StepOutput, run_to_completion

log = logging.getLogger("batchlab.openai")

QUEUE_WAIT_S = 0.005  # step() waits this long for a chunk, then returns None
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0
WARMUP_PROMPT = [1, 415, 2936, 9060, 285, 1142]
WARMUP_OUTPUT_LEN = 4


@dataclass(slots=True)
class Chunk:
    """Tokens of one request received at `time`; `end` is set on its last chunk."""

    request_id: int
    time: float
    token_ids: list[int]
    end: str | None = None  # None: more to come; "ok": finished; otherwise the failure reason


@dataclass(slots=True)
class _Tally:
    """Counting one stream under the rule in the module docstring."""

    row: Row
    seen: int = 0  # tokens emitted or held so far
    held: list[Chunk] = field(default_factory=list)  # rule-3 chunks awaiting the usage report
    usage_total: int | None = None


def base_url(endpoint: str) -> str:
    """'http://h:8000/v1/' → 'http://h:8000' (the paths below add /v1/...)."""
    url = endpoint.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def request_body(model: str, row: Row) -> dict:
    """Greedy, exactly output_len tokens (ignore_eos/min_tokens are vLLM extensions, ignored elsewhere)."""
    return {"model": model, "prompt": row.prompt_tokens, "max_tokens": row.output_len,
            "min_tokens": row.output_len, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def count_chunk(tally: _Tally, obj: dict, t: float) -> Chunk | None:
    """Apply the counting rule to one parsed chunk; returns a chunk to emit now, or None."""
    choices, usage = obj.get("choices") or [], obj.get("usage")
    if not choices:  # the final usage-only chunk
        if usage:
            tally.usage_total = int(usage.get("completion_tokens", 0))
        return None
    choice = choices[0]
    if choice.get("token_ids"):
        ids = [int(i) for i in choice["token_ids"]]
    elif usage and usage.get("completion_tokens") is not None:
        ids = [-1] * max(0, int(usage["completion_tokens"]) - tally.seen)
    else:
        if choice.get("text"):
            tally.held.append(Chunk(tally.row.request_id, t, [-1]))
            tally.seen += 1
        return None
    tally.seen += len(ids)
    return Chunk(tally.row.request_id, t, ids) if ids else None


def settle(tally: _Tally, t: float) -> list[Chunk]:
    """Correct the held chunks against the usage report; the last returned chunk carries `end`."""
    total = tally.usage_total if tally.usage_total is not None else tally.seen
    diff, held = total - tally.seen, tally.held
    if diff > 0:
        held = held or [Chunk(tally.row.request_id, t, [])]
        held[-1].token_ids.extend([-1] * diff)
    for chunk in reversed(held):
        while diff < 0 and chunk.token_ids:
            chunk.token_ids.pop()
            diff += 1
    out = [c for c in held if c.token_ids] or [Chunk(tally.row.request_id, t, [])]
    want = tally.row.output_len
    out[-1].end = "ok" if total == want else f"stream error: server returned {total} of {want} tokens"
    return out


def parse_prefix_cache_counters(text: str) -> dict[str, float]:
    """{'queries': Σ, 'hits': Σ} from vLLM's /metrics text (every label set summed); {} if absent."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        for key, name in (("queries", "vllm:prefix_cache_queries_total"), ("hits", "vllm:prefix_cache_hits_total")):
            if line.startswith(name) and (len(line) == len(name) or line[len(name)] in "{ "):
                try:
                    totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    continue
    return totals if len(totals) == 2 else {}


class OpenAIBackend:
    """Streams completions from --endpoint with at most --max-concurrency requests in flight."""

    def __init__(self, endpoint: str, model: str, max_concurrency: int = 64, mode: str = "continuous") -> None:
        import httpx

        self.base = base_url(endpoint)
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        self.client = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max_concurrency))
        self.served_model = self._pick_model(model)
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="openai-stream")
        self.chunks: queue.Queue[Chunk] = queue.Queue()
        self.open: dict[int, float] = {}  # request_id -> time of its last chunk (or admission)
        self.stopping = threading.Event()
        self.info = BackendInfo(backend="openai", model=model, mode=mode, max_batch_size=max_concurrency,
                                kv_bytes_per_token=0, kv_budget_bytes=0, device="remote", memory_kind="none",
                                facts={"endpoint": self.base, "served_model": self.served_model,
                                       "token_count_rule": "token_ids > continuous usage > 1 per text chunk "
                                                           "(held, settled against final usage)"})

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int = 0) -> "OpenAIBackend":
        """Build from a RunConfig (the server's concurrency is --max-concurrency: `rows` is unused)."""
        return cls(cfg.endpoint, cfg.model, cfg.max_concurrency, mode)

    def _pick_model(self, wanted: str) -> str:
        """The served model id: `wanted` if the server lists it, else the first it lists."""
        try:
            resp = self.client.get(f"{self.base}/v1/models", timeout=CONNECT_TIMEOUT_S)
            resp.raise_for_status()
            ids = [m["id"] for m in resp.json().get("data", [])]
        except Exception as exc:
            raise BackendError(f"endpoint {self.base} unreachable: {type(exc).__name__}: {exc}") from None
        if wanted in ids or not ids:
            return wanted
        log.info("endpoint serves %s; using %r for --model %r", ids, ids[0], wanted)
        return ids[0]

    # --- stream threads ---------------------------------------------------------------------------
    def _stream(self, row: Row) -> None:
        tally = _Tally(row)
        try:
            self._read_stream(tally)
            for chunk in settle(tally, now()):
                self.chunks.put(chunk)
        except Exception as exc:  # a cut or refused stream fails this request, never the worker
            self.chunks.put(Chunk(row.request_id, now(), [], f"stream error: {type(exc).__name__}: {exc}"))

    def _read_stream(self, tally: _Tally) -> None:
        body = request_body(self.served_model, tally.row)
        with self.client.stream("POST", f"{self.base}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.read().decode(errors='replace')[:200]}")
            for line in resp.iter_lines():
                t = now()
                if self.stopping.is_set():
                    raise RuntimeError("backend closed")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = count_chunk(tally, json.loads(data), t)
                if chunk is not None:
                    self.chunks.put(chunk)
        raise RuntimeError("stream ended without [DONE]")

    # --- the ContinuousBackend protocol -----------------------------------------------------------
    def warmup(self) -> None:
        """A couple of short completions (BackendError if the endpoint cannot serve them), then the
        server's prefix cache is emptied where its API allows, and its cache counters are read."""
        rows = [Row(-1 - i, len(WARMUP_PROMPT), WARMUP_OUTPUT_LEN, WARMUP_PROMPT, -1) for i in range(2)]
        self.run_batch(rows, lambda _out: None)
        self.info.facts["prefix_cache_reset"] = self._reset_prefix_cache()
        self.cache_start = self._prefix_cache_counters()
        self.info.facts["prefix_cache_metrics"] = "vllm:prefix_cache_{queries,hits}_total" if self.cache_start else None

    def _reset_prefix_cache(self) -> str:
        """vLLM's POST /reset_prefix_cache (served only with VLLM_SERVER_DEV_MODE=1): a run must not hit
        prompts that an earlier run left in the cache. Says what happened, in words."""
        try:
            resp = self.client.post(f"{self.base}/reset_prefix_cache", timeout=CONNECT_TIMEOUT_S)
        except Exception as exc:
            return f"not reset: {type(exc).__name__}"
        if resp.status_code == 200:
            return "reset before the run"
        return (f"not reset: the server answered HTTP {resp.status_code} (a vLLM server allows it when "
                "started with VLLM_SERVER_DEV_MODE=1); an earlier run's prompts may be served from its cache")

    def _prefix_cache_counters(self) -> dict[str, float]:
        """vLLM's Prometheus counters of prefix-cache queries and hits ({} when the server has none)."""
        try:
            resp = self.client.get(f"{self.base}/metrics", timeout=CONNECT_TIMEOUT_S)
        except Exception:
            return {}
        if resp.status_code != 200:
            return {}
        return parse_prefix_cache_counters(resp.text)

    def run_facts(self) -> dict:
        """The server's prefix-cache hit rate over this run (token queries and hits since warm-up)."""
        start, end = getattr(self, "cache_start", {}), self._prefix_cache_counters()
        if not start or not end:
            return {}
        queries, hits = end["queries"] - start["queries"], end["hits"] - start["hits"]
        return {"server_prefix_cache": {"queried_tokens": queries, "hit_tokens": hits,
                                        "hit_rate": hits / queries if queries else None}}

    def admit(self, rows: list[Row]) -> None:
        """Start a stream per row (queued in the pool beyond --max-concurrency)."""
        for row in rows:
            self.open[row.request_id] = now()
            self.pool.submit(self._stream, row)

    def has_work(self) -> bool:
        """True while any admitted request has not ended."""
        return bool(self.open)

    def step(self) -> StepOutput | None:
        """The next received chunk as a step, or None after QUEUE_WAIT_S without one."""
        try:
            chunk = self.chunks.get(timeout=QUEUE_WAIT_S)
        except queue.Empty:
            return None
        rid = chunk.request_id
        start = self.open.get(rid, chunk.time)
        out = StepOutput(time=chunk.time, request_ids=[rid] * len(chunk.token_ids), token_ids=chunk.token_ids,
                         start_time=start, running=len(self.open))
        if chunk.end is None:
            self.open[rid] = chunk.time
        elif self.open.pop(rid, None) is not None:
            (out.finished.append(rid) if chunk.end == "ok" else out.failed.append((rid, chunk.end)))
        return out

    def run_batch(self, rows: list[Row], on_step: Callable[[StepOutput], None]) -> None:
        """Static mode: start every row and stream until all ended (see backend.run_to_completion)."""
        run_to_completion(self, rows, on_step)

    def abort_all(self) -> None:
        """Forget every open stream (after a failed step): the stop flag ends each at its next line (a stalled
        read within READ_TIMEOUT_S), then a fresh pool and queue serve on, so no stale chunk reopens a row."""
        self.stopping.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = ThreadPoolExecutor(max_workers=self.info.max_batch_size, thread_name_prefix="openai-stream")
        self.chunks = queue.Queue()
        self.open.clear()
        self.stopping.clear()

    def peak_memory_bytes(self) -> int:
        """The server's memory is not visible from here."""
        return 0

    def close(self) -> None:
        """Stop the streams (they fail with 'backend closed') and release the connections."""
        self.stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
