"""A scripted OpenAI-compatible server for the evaluation's tests: ``http.server`` in a thread.

``GET /v1/models`` lists one model; each ``POST /v1/chat/completions`` is answered by the script, a
function of the request's parsed body and its number (from 0, over chat requests) returning a
:class:`Reply`. Every chat request is kept with its body and what the server answered, so a test
counts what was sent independently of what the evaluation says it received.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One answer: a completion whose message is ``content`` (status 200), or an error status."""

    kind: str  # the script's own name for what it sent: valid, parse_failure, ..., or the status code
    content: str | None = None
    status: int = 200
    retry_after: str | None = None


@dataclass(frozen=True)
class Exchange:
    body: dict[str, Any]
    reply: Reply


Script = Callable[[dict[str, Any], int], Reply]


def completion(body: dict[str, Any], content: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }).encode()  # fmt: skip


@contextmanager
def scripted_server(script: Script) -> Iterator[tuple[str, list[Exchange]]]:
    """Serve ``script`` on 127.0.0.1; yields the ``/v1`` base URL and the list of chat exchanges."""
    exchanges: list[Exchange] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's pooled connections expect

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self.send(200, json.dumps({"object": "list", "data": [{"id": "scripted"}]}).encode())
            else:
                self.send(404, b'{"error": {"message": "no such route"}}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                reply = script(body, len(exchanges))
                exchanges.append(Exchange(body, reply))
            if reply.status != 200:
                error = json.dumps({"error": {"message": f"scripted {reply.status}"}}).encode()
                headers = {"Retry-After": reply.retry_after} if reply.retry_after is not None else {}
                self.send(reply.status, error, headers)
            else:
                self.send(200, completion(body, reply.content or ""))

        def send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as base_url:
        yield base_url, exchanges


class Server(ThreadingHTTPServer):
    # the evaluation opens up to 64 connections at once; the default backlog of 5 refuses some of them,
    # which a test allowing one attempt per request would count as requests without an answer
    request_queue_size = 256
    daemon_threads = True


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on 127.0.0.1 (an ephemeral port) from a thread; yields the ``/v1`` base URL."""
    server = Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
