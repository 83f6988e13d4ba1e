"""The `openai` backend: streams `/v1/completions` from a running server (vLLM, TGI, SGLang, llama.cpp …).

Each request is one streamed completion on one of --max-concurrency stream threads; every chunk is stamped
on receipt and handed to `step()` through a queue; a step takes every chunk received since the last one (up to
MAX_CHUNKS_PER_STEP), each token keeping its own receipt time (StepOutput.times). One step per chunk would
make a worker loop pass, a Step record and a steps.parquet row per token: 18 million for an hour at 100 req/s
with 500-token replies.

The threads, their queues and their HTTP client are one generation (`_Streams`): `abort_all()` ends it
without waiting (each open response's socket is shut down, which wakes a read the server stalls and tells
the server to abort the request; the threads are daemons, so one still blocked elsewhere holds up nothing)
and starts a fresh one, so a stale chunk can never reach the new queue and reopen a row.

How a chunk's tokens are counted, and why a request fails for its count: worker.openai_count.
"""
import json
import logging
import queue
import socket
import threading
from collections.abc import Callable

from batchlab.protocol.clock import now
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.status import FailureKind, detailed
from batchlab.worker.backend import Backend, BackendError, BackendInfo, BackendRequest, StepOutput
from batchlab.worker.openai_count import Chunk, OpenAIStreamRequest, count_chunk, parse_prefix_cache_counters, settle

log = logging.getLogger("batchlab.openai")

QUEUE_WAIT_S = 0.005  # step() waits this long for a chunk, then returns None
MAX_CHUNKS_PER_STEP = 1024  # one step takes at most this many received chunks (the rest: the next step)
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0
WARMUP_PROMPT = [1, 415, 2936, 9060, 285, 1142]
WARMUP_OUTPUT_LEN = 4


def base_url(endpoint: str) -> str:
    """'http://h:8000/v1/' → 'http://h:8000' (the paths below add /v1/...)."""
    return endpoint.rstrip("/").removesuffix("/v1")


def request_body(model: str, row: BackendRequest) -> dict:
    """Greedy, exactly output_len tokens (ignore_eos/min_tokens are vLLM extensions, ignored elsewhere)."""
    return {"model": model, "prompt": row.prompt_tokens, "max_tokens": row.output_len,
            "min_tokens": row.output_len, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def new_client(max_connections: int):
    import httpx

    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    return httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max_connections))


class _Streams:
    """One generation of stream threads (see the module docstring): rows in, chunks out."""

    def __init__(self, threads: int, run: Callable[[BackendRequest, "_Streams"], None]) -> None:
        self.client = new_client(threads)
        self.rows: queue.Queue[BackendRequest | None] = queue.Queue()
        self.chunks: queue.Queue[Chunk] = queue.Queue()
        self.stopping = threading.Event()
        self.sockets: dict[int, socket.socket] = {}  # request_id -> its open response's socket
        self.threads = [threading.Thread(target=self._serve, args=(run,), daemon=True, name=f"openai-stream-{i}")
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def _serve(self, run: Callable[[BackendRequest, "_Streams"], None]) -> None:
        while (row := self.rows.get()) is not None and not self.stopping.is_set():
            run(row, self)

    def opened(self, request_id: int, response) -> None:
        """Note an open response's socket, so stop() can cut it (where the transport exposes it)."""
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            self.sockets[request_id] = sock

    def stop(self) -> None:
        """End this generation now: no row starts, every open response is cut, nothing is waited for."""
        self.stopping.set()
        for _ in self.threads:
            self.rows.put(None)
        for sock in list(self.sockets.values()):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.client.close()


class OpenAIBackend(Backend):
    """Streams completions from --endpoint with at most --max-concurrency requests in flight."""

    def __init__(self, endpoint: str, model: str, max_concurrency: int = 64,
                 mode: str = BatchingMode.CONTINUOUS) -> None:
        self.base = base_url(endpoint)
        self.client = new_client(2)  # the server's model list, metrics and cache reset
        self.served_model = self._pick_model(model)
        self.streams = _Streams(max_concurrency, self._stream)
        self.open: dict[int, float] = {}  # request_id -> time of its last chunk (or admission)
        self.cache_start: dict[str, float] = {}  # the server's prefix-cache counters after warm-up
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
    def _stream(self, row: BackendRequest, streams: _Streams) -> None:
        tally = OpenAIStreamRequest(row)
        try:
            self._read_stream(tally, streams)
            for chunk in settle(tally, now()):
                streams.chunks.put(chunk)
        except Exception as exc:  # a cut or refused stream fails this request, never the worker
            reason = detailed(FailureKind.STREAM_ERROR, f"{type(exc).__name__}: {exc}")
            streams.chunks.put(Chunk(row.request_id, now(), [], reason))
        finally:
            streams.sockets.pop(row.request_id, None)

    def _read_stream(self, tally: OpenAIStreamRequest, streams: _Streams) -> None:
        body = request_body(self.served_model, tally.row)
        with streams.client.stream("POST", f"{self.base}/v1/completions", json=body) as resp:
            streams.opened(tally.row.request_id, resp)
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.read().decode(errors='replace')[:200]}")
            for line in resp.iter_lines():
                t = now()
                if streams.stopping.is_set():
                    raise RuntimeError("backend closed")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = count_chunk(tally, json.loads(data), t)
                if chunk is not None:
                    streams.chunks.put(chunk)
        raise RuntimeError("stream ended without [DONE]")

    # --- the Backend interface (continuous; static batches by the default run_batch) ---------------
    def warmup(self) -> None:
        """A couple of short completions (BackendError if the endpoint cannot serve them), then the
        server's prefix cache is emptied where its API allows, and its cache counters are read."""
        rows = [BackendRequest.new(-1 - i, len(WARMUP_PROMPT), WARMUP_OUTPUT_LEN, WARMUP_PROMPT, -1) for i in range(2)]
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
        return parse_prefix_cache_counters(resp.text) if resp.status_code == 200 else {}

    def run_facts(self) -> dict:
        """The server's prefix-cache hit rate over this run (token queries and hits since warm-up)."""
        start, end = self.cache_start, self._prefix_cache_counters()
        if not start or not end:
            return {}
        queries, hits = end["queries"] - start["queries"], end["hits"] - start["hits"]
        return {"server_prefix_cache": {"queried_tokens": queries, "hit_tokens": hits,
                                        "hit_rate": hits / queries if queries else None}}

    def admit(self, rows: list[BackendRequest]) -> None:
        """Start a stream per row (queued beyond --max-concurrency)."""
        for row in rows:
            self.open[row.request_id] = now()
            self.streams.rows.put(row)

    def has_work(self) -> bool:
        """True while any admitted request has not ended."""
        return bool(self.open)

    def step(self) -> StepOutput | None:
        """Every chunk received so far (waiting up to QUEUE_WAIT_S for the first) as one step, each token
        at its own receipt time; None when none came. `start_time` is the earliest previous event (admit or
        chunk) of the requests in it; `running` the streams open when it began."""
        try:
            chunks = [self.streams.chunks.get(timeout=QUEUE_WAIT_S)]
        except queue.Empty:
            return None
        while len(chunks) < MAX_CHUNKS_PER_STEP:
            try:
                chunks.append(self.streams.chunks.get_nowait())
            except queue.Empty:
                break
        out = StepOutput(time=max(c.time for c in chunks), request_ids=[], token_ids=[], start_time=chunks[0].time,
                         running=len(self.open), times=[])
        for chunk in chunks:
            rid = chunk.request_id
            out.start_time = min(out.start_time, self.open.get(rid, chunk.time))
            out.request_ids += [rid] * len(chunk.token_ids)
            out.token_ids += chunk.token_ids
            out.times += [chunk.time] * len(chunk.token_ids)
            if chunk.end is None:
                if rid in self.open:
                    self.open[rid] = chunk.time
            elif self.open.pop(rid, None) is not None:
                (out.finished.append(rid) if chunk.end == "ok" else out.failed.append((rid, chunk.end)))
        return out

    def abort_all(self) -> None:
        """Forget every open stream (after a failed step) at once: a fresh generation of threads, queues and
        client serves on; the old one is cut and not waited for (see the module docstring)."""
        old, self.streams = self.streams, _Streams(self.info.max_batch_size, self._stream)
        old.stop()
        self.open.clear()

    def close(self) -> None:
        """Cut the streams and release the connections."""
        self.streams.stop()
        self.client.close()
