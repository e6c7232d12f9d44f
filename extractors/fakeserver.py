"""A local OpenAI-compatible HTTP server for tests and benchmarks.

A real HTTP/1.1 server (asyncio, stdlib only) on 127.0.0.1 with an ephemeral
port, running its own event loop in a background thread. It implements
``POST /v1/chat/completions`` and ``GET /v1/models``, records every request it
receives, and answers each chat request with the next scripted behaviour:

* ``reply(content)`` / ``valid()``: 200 with that content (or the responder's),
* ``malformed()``: 200 whose message content is not JSON,
* ``status(429, retry_after=0.2)``, ``status(500)``, ``status(400, ...)``: an error,
* ``slow(seconds)``: answer only after ``seconds`` (past the client's timeout),
* ``drop()``: read the request, then close the connection without answering.

Scripts are FIFO queues: ``enqueue_for(marker, ...)`` applies to requests whose
messages contain ``marker`` (so concurrent jobs can be scripted independently);
``enqueue(...)`` applies to any request; with both empty the responder answers.

Run standalone (for the benchmark, so the server does not share the client's
interpreter): ``python -m extractors.fakeserver --latency 0.1`` prints
``PORT <n>`` and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Responder = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Behaviour:
    """What the server does with one chat request."""

    kind: str  # reply | malformed | status | slow | drop
    content: str | None = None  # reply body content; None = ask the responder
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0


def reply(content: str | None = None) -> Behaviour:
    return Behaviour("reply", content=content)


def valid() -> Behaviour:
    return Behaviour("reply")


def malformed(text: str = '{"anchors": [{"type": "preference", "text": ') -> Behaviour:
    return Behaviour("malformed", content=text)


def status(code: int, *, retry_after: float | None = None, message: str = "scripted error") -> Behaviour:
    headers = (("Retry-After", f"{retry_after:g}"),) if retry_after is not None else ()
    return Behaviour("status", content=message, status=code, headers=headers)


def slow(delay: float, content: str | None = None) -> Behaviour:
    return Behaviour("slow", content=content, delay=delay)


def drop() -> Behaviour:
    return Behaviour("drop")


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    behaviour: str
    at: float  # time.monotonic() on arrival

    def text(self) -> str:
        """All message contents joined (what the model was shown)."""
        messages = (self.body or {}).get("messages", [])
        return "\n".join(str(m.get("content", "")) for m in messages)


def default_responder(request: dict[str, Any]) -> str:
    """A schema-valid answer: a clean intent or a clean rationale."""
    fmt = request.get("response_format") or {}
    name = (fmt.get("json_schema") or {}).get("name", "")
    if name == "intent" or "anchors" in json.dumps(request.get("messages", [])[:1]):
        return json.dumps(
            {
                "anchors": [
                    {"type": "preference", "text": "drawn to relaxed, breathable fabrics", "confidence": 0.7},
                    {"type": "concern", "text": "hesitates when the fit looks uncertain", "confidence": 0.6},
                ]
            }
        )
    return json.dumps({"rationale": "This looks close to what I want, so I'll take a closer look."})


@dataclass
class _Script:
    default: deque[Behaviour] = field(default_factory=deque)
    by_marker: dict[str, deque[Behaviour]] = field(default_factory=dict)

    def next_for(self, body_text: str) -> Behaviour:
        for marker, queue in self.by_marker.items():
            if queue and marker in body_text:
                return queue.popleft()
        return self.default.popleft() if self.default else valid()


class FakeOpenAIServer:
    """An OpenAI-compatible chat server on 127.0.0.1; use as a context manager."""

    def __init__(
        self, *, responder: Responder | None = None, latency: float = 0.0, model: str = "fake-model"
    ):
        self.responder = responder or default_responder
        self.latency = latency
        self.model = model
        self._lock = threading.Lock()
        self._script = _Script()
        self._requests: list[ReceivedRequest] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle -------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="fake-openai", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(5)
        self._loop = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # --- scripting and inspection ---------------------------------------
    def enqueue(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._script.default.extend(behaviours)

    def enqueue_for(self, marker: str, *behaviours: Behaviour) -> None:
        with self._lock:
            self._script.by_marker.setdefault(marker, deque()).extend(behaviours)

    def pending(self) -> int:
        """Scripted behaviours not consumed yet (a test expects 0 at its end)."""
        with self._lock:
            return len(self._script.default) + sum(len(q) for q in self._script.by_marker.values())

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def chat_requests(self, marker: str | None = None) -> list[ReceivedRequest]:
        chats = [r for r in self.requests if r.path.endswith("/chat/completions")]
        return [r for r in chats if marker is None or marker in r.text()]

    def reset(self) -> None:
        with self._lock:
            self._script = _Script()
            self._requests.clear()

    # --- the server ------------------------------------------------------
    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port, backlog=2048)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one_request(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass  # the client went away (e.g. after its own timeout)
        except asyncio.CancelledError:
            pass  # server shutdown: end quietly
        finally:
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False closes the connection."""
        head = await reader.readuntil(b"\r\n\r\n")
        method, path, headers = _parse_head(head)
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "GET" and path.endswith("/models"):
            self._record(method, path, headers, None, "models")
            return await _respond(
                writer, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            )
        body = json.loads(raw) if raw else {}
        shown = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        with self._lock:
            behaviour = self._script.next_for(shown)
        self._record(method, path, headers, body, behaviour.kind)
        if self.latency:
            await asyncio.sleep(self.latency)
        return await self._act(writer, behaviour, body)

    def _record(self, method: str, path: str, headers: dict[str, str], body: Any, kind: str) -> None:
        with self._lock:
            self._requests.append(ReceivedRequest(method, path, headers, body, kind, time.monotonic()))

    async def _act(self, writer: asyncio.StreamWriter, behaviour: Behaviour, body: dict[str, Any]) -> bool:
        if behaviour.kind == "drop":
            writer.transport.abort()  # no status line at all: the client sees a dropped connection
            return False
        if behaviour.kind == "status":
            error = {"error": {"message": behaviour.content, "type": "scripted", "code": behaviour.status}}
            return await _respond(writer, behaviour.status, error, behaviour.headers)
        if behaviour.kind == "slow":
            await asyncio.sleep(behaviour.delay)
        content = behaviour.content if behaviour.content is not None else self.responder(body)
        return await _respond(writer, 200, self._completion(body, content))

    def _completion(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        prompt_tokens, completion_tokens = prompt_chars // 4 + 1, len(content) // 4 + 1
        return {
            "id": f"chatcmpl-{len(self._requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", self.model),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


_REASONS = {200: "OK", 400: "Bad Request", 429: "Too Many Requests", 500: "Internal Server Error"}


async def _respond(
    writer: asyncio.StreamWriter, code: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()
) -> bool:
    data = json.dumps(payload).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    head = (
        f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n{extra}\r\n"
    )
    writer.write(head.encode("latin-1") + data)
    await writer.drain()
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every chat request")
    args = parser.parse_args(argv)
    with FakeOpenAIServer(latency=args.latency) as server:
        print(f"PORT {server.port}", flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin


if __name__ == "__main__":
    main()
