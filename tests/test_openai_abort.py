"""The `openai` backend against a fake server on loopback. One stream stalls: abort_all() returns at once,
cuts the stalled response (the server sees the connection close, as vLLM does when it aborts a request), and
the backend serves on; nothing of the aborted stream comes back. And a step takes every chunk received so
far, each token at its own receipt time."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from batchlab.worker.backend import BackendRequest
from batchlab.worker import openai_client
from batchlab.worker.openai_client import READ_TIMEOUT_S, OpenAIBackend
from batchlab.worker.openai_count import Chunk

STALL = 9  # a prompt [STALL] gets one chunk, then nothing


class FakeServer(BaseHTTPRequestHandler):
    cut = threading.Event()  # set when the stalled stream's connection is closed by the client

    def log_message(self, *args) -> None:
        pass

    def _send(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "fake"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = request["max_tokens"]
        if request["prompt"] == [STALL]:
            self._send({"choices": [{"index": 0, "text": "a", "token_ids": [5]}]})
            if self.rfile.read(1) == b"":  # blocks until the client closes its side
                FakeServer.cut.set()
            return
        for i in range(n):
            self._send({"choices": [{"index": 0, "text": "a", "token_ids": [100 + i]}]})
        self._send({"choices": [], "usage": {"completion_tokens": n}})
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def drain(backend: OpenAIBackend, until, limit_s: float = 60.0) -> list:
    outs, deadline = [], time.monotonic() + limit_s
    while not until(outs):
        assert time.monotonic() < deadline, "timed out"
        out = backend.step()
        if out is not None:
            outs.append(out)
    return outs


def test_abort_all_cuts_a_stalled_stream_at_once_and_the_backend_serves_on(server):
    FakeServer.cut.clear()
    backend = OpenAIBackend(server, "fake", max_concurrency=4)
    try:
        backend.admit([BackendRequest.new(1, 1, 4, [STALL], 0)])
        drain(backend, lambda outs: any(1 in o.request_ids for o in outs))  # its first chunk came
        started = time.monotonic()
        backend.abort_all()
        assert time.monotonic() - started < READ_TIMEOUT_S / 10  # not a stalled read's timeout
        assert FakeServer.cut.wait(30) and not backend.has_work()
        backend.admit([BackendRequest.new(2, 3, 3, [1, 2, 3], 0)])
        outs = drain(backend, lambda outs: any(2 in o.finished for o in outs))
        assert [t for o in outs for t in o.token_ids] == [100, 101, 102]
        assert all(1 not in o.request_ids and not o.failed for o in outs)  # the aborted row stays gone
    finally:
        backend.close()


def test_a_step_takes_every_chunk_received_so_far_each_token_at_its_own_time(server, monkeypatch):
    monkeypatch.setattr(openai_client, "MAX_CHUNKS_PER_STEP", 4)
    backend = OpenAIBackend(server, "fake", max_concurrency=2)
    try:
        backend.open.update({7: 1.0, 8: 2.0})  # as admit() leaves them (no stream is started here)
        for chunk in (Chunk(7, 3.0, [70]), Chunk(8, 4.0, [80, 81]), Chunk(7, 5.0, [71]),
                      Chunk(7, 6.0, [], "ok"), Chunk(8, 7.0, [82]), Chunk(8, 8.0, [], "boom")):
            backend.streams.chunks.put(chunk)
        first = backend.step()
        assert (first.request_ids, first.token_ids, first.times) == ([7, 8, 8, 7], [70, 80, 81, 71],
                                                                      [3.0, 4.0, 4.0, 5.0])
        assert (first.start_time, first.time, first.running, first.finished) == (1.0, 6.0, 2, [7])
        second = backend.step()  # the rest: MAX_CHUNKS_PER_STEP chunks went into the first
        assert (second.request_ids, second.times, second.start_time) == ([8], [7.0], 4.0)
        assert second.failed == [(8, "boom")] and not backend.has_work()
        assert backend.step() is None
    finally:
        backend.close()
