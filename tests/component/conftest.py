"""The component layer's rig: the gateway app in this process, driven over ASGI, in front of fake upstreams on
real loopback sockets whose every answer the test scripts.

Why ASGI by hand rather than an HTTP client over a socket: a test must decide exactly when its client hangs up
(while queued, mid-body, after ``[DONE]``), send a body slowly, or stop reading, and see each streamed chunk as
the gateway sends it. :class:`Exchange` plays uvicorn's part of the ASGI contract (a body, then
``http.disconnect`` once the client hangs up or the answer is complete; sends after a hang-up are dropped) and
nothing more. Everything from the app's entry point on is the real gateway: the lifespan and its loops, the
admission queue, the aiohttp upstream client and its connection pool, on the event loop the server runs
(:func:`pytest_asyncio_loop_factories`). ``test_served.py`` runs the same app under uvicorn on a socket for
what only a socket shows.

Waits are on events: a fake upstream reports each request it reads and each answer the gateway abandons;
:func:`until` waits for a condition of the gateway's own state. Their time bounds are there only so that a
broken test fails instead of hanging. The timeouts the gateway takes from its settings are set small by the
tests that need them to pass; a test sleeps only to outlast one of those on purpose.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from starlette.types import ASGIApp, Message

from gateway.common.asgi_server import NumericConnectLoop
from gateway.server.app import create_server_app
from gateway.server.parts import Gateway
from gateway.server.upstream.pool import Upstream
from gateway.settings import Settings

MODEL = "m"
CHAT = [{"role": "user", "content": "hi"}]
#: How long any one wait may take before the test fails: a bound against hanging, not a timing assumption.
BOUND_S = 10.0

# --- what the fake upstreams send ------------------------------------------------------------------------


def sse(payload: dict[str, Any] | str, *, name: str | None = None, crlf: bool = False) -> bytes:
    """One server-sent event: ``data: <json>`` (or the text given), with an ``event:`` line when named."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    lines = ([f"event: {name}"] if name else []) + [f"data: {data}"]
    end = "\r\n" if crlf else "\n"
    return (end.join(lines) + end + end).encode()


def token(text: str, *, crlf: bool = False) -> bytes:
    return sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}, crlf=crlf)


ROLE = sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
STOP = sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
DONE = b"data: [DONE]\n\n"


def usage(prompt: int, completion: int) -> bytes:
    return sse(
        {
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
    )


def chat_answer(content: str = "hello", *, prompt: int = 3, completion: int = 1, id_: str = "cmpl-1") -> dict:
    return {
        "id": id_,
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def openai_error(message: str, status: int) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": status}}


#: What the gateway's own loops GET of an upstream (health poll, backend scrape): answered, never recorded.
POLLED = frozenset({"/health", "/v1/models", "/metrics", "/props", "/slots"})

# --- fake upstreams --------------------------------------------------------------------------------------


@dataclass
class Seen:
    """One request a fake upstream read in full."""

    method: str
    path: str
    query: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    aborted: bool = False  # the gateway closed the connection before this request's answer was whole

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Gate:
    """A point a scripted answer stops at until the test opens it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def open(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


Behaviour = Callable[[web.Request, Seen, "FakeUpstream"], Awaitable[web.StreamResponse]]


class FakeUpstream:
    """An OpenAI-style server on a loopback port whose answers each test scripts.

    ``GET /health``, ``/v1/models``, ``/metrics`` and ``/props`` answer from ``health``, ``models``,
    ``metrics_text`` and ``props`` (unset: 404, as on a server that is not llama-server; ``/slots`` too); any other
    request is recorded in ``received`` and answered by the next behaviour queued with :meth:`then`, or by
    ``default`` when none is queued. With ``close_kept`` set, a request arriving on a connection that already
    served one is dropped unread (the keep-alive race: the server closed it as the request went out), counted in
    ``unread`` and not in ``received``. An answer cut short by the gateway (its connection closed) marks its
    :class:`Seen` ``aborted``: handlers are cancelled when their client goes.
    """

    def __init__(self, *, models: list[str] | None = None) -> None:
        self.models: list[str] | None = [MODEL] if models is None else models
        self.health = 200
        self.metrics_text: str | None = None  # None: /metrics answers 404, as on a plain OpenAI server
        self.props: dict[str, Any] | None = None  # set (``{"total_slots": 4}``): /props answers, as llama-server's
        self.default: Behaviour = whole(chat_answer())
        self.close_kept = False
        self.received: list[Seen] = []
        self.polled: Counter[str] = Counter()  # the gateway's GETs of POLLED paths, by path
        self.unread = 0
        self.url = ""
        self.stopping = asyncio.Event()
        self._script: deque[Behaviour] = deque()
        self._served: list[object] = []  # protocols (connections) that answered a request
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    def then(self, *behaviours: Behaviour) -> FakeUpstream:
        self._script.extend(behaviours)
        return self

    def posts(self, path: str | None = None) -> list[Seen]:
        return [s for s in self.received if s.method == "POST" and (path is None or s.path == path)]

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds, woken by each request this upstream reads or sees abandoned."""
        async with asyncio.timeout(BOUND_S):
            while not predicate():
                await self._changed.wait()

    async def received_count(self, count: int) -> list[Seen]:
        await self.wait(lambda: len(self.received) >= count)
        return self.received

    async def start(self) -> FakeUpstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await self._site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop_listening(self) -> None:
        """Refuse new connections; the open ones stay as they are (a server going away under kept connections)."""
        assert self._site is not None
        await self._site.stop()

    async def close(self) -> None:
        """Stop listening (a later connection is refused) and end every answer still held open."""
        self.stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path in POLLED:
            return self._poll(request.path)
        body = await request.read()
        if self.close_kept and request.protocol in self._served:
            self.unread += 1
            self.notify()
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        seen = Seen(
            request.method,
            request.path,
            request.query_string,
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        self.received.append(seen)
        self.notify()
        behaviour = self._script.popleft() if self._script else self.default
        try:
            response = await behaviour(request, seen, self)
        except asyncio.CancelledError:
            seen.aborted = True
            self.notify()
            raise
        self._served.append(request.protocol)
        return response

    def _poll(self, path: str) -> web.Response:
        self.polled[path] += 1
        self.notify()
        if path == "/health":
            return web.json_response({"status": "ok" if self.health == 200 else "down"}, status=self.health)
        if path == "/v1/models":
            if self.models is None:
                return web.json_response({"error": "no such route"}, status=404)
            return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})
        if path == "/props" and self.props is not None:
            return web.json_response(self.props)
        if path != "/metrics" or self.metrics_text is None:
            return web.Response(status=404, text="not found")
        return web.Response(text=self.metrics_text, content_type="text/plain")


# --- behaviours: how a fake upstream answers one request -------------------------------------------------


def whole(payload: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> Behaviour:
    """A whole JSON answer."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        return web.json_response(payload, status=status, headers=headers)

    return answer


def raw(status: int, body: bytes, *, content_type: str = "text/plain", headers: dict[str, str] | None = None):
    """A whole answer of any bytes."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        return web.Response(status=status, body=body, content_type=content_type, headers=headers)

    return answer


def refuse(status: int, *, retry_after: str | None = None, shaped: bool = True) -> Behaviour:
    """An error status, with an OpenAI-shaped body (``shaped``) or a plain-text one."""
    headers = {"Retry-After": retry_after} if retry_after else None
    if shaped:
        return whole(openai_error(f"fake upstream answers {status}", status), status=status, headers=headers)
    return raw(status, f"fake upstream answers {status}".encode(), headers=headers)


def stream(*parts: bytes | Gate, end: str = "eof", status: int = 200) -> Behaviour:
    """A streamed answer: each ``bytes`` part written as it comes, each :class:`Gate` waited for. ``end``: "eof"
    (the body ends), "die" (the connection is closed mid-body), or "hang" (the body stays open until the
    upstream closes)."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for part in parts:
                if isinstance(part, Gate):
                    await part.wait()
                else:
                    await response.write(part)
        except ConnectionResetError:  # the gateway closed the connection between two parts
            seen.aborted = True
            upstream.notify()
            return response
        if end == "die":
            assert request.transport is not None
            request.transport.close()
            return response
        if end == "hang":
            await upstream.stopping.wait()
        await response.write_eof()
        return response

    return answer


def body_then(payload: bytes, *, sent: int, end: str, gate: Gate | None = None, status: int = 200) -> Behaviour:
    """A whole answer whose declared length is ``len(payload)`` but only ``sent`` bytes of it are written; then
    ``end``: "die" (the connection closes) or "hang" (the rest never comes). ``gate``: the rest comes when it
    opens."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[:sent])
        if gate is not None:
            await gate.wait()
            await response.write(payload[sent:])
            await response.write_eof()
            return response
        if end == "die":
            assert request.transport is not None
            request.transport.close()
            return response
        await upstream.stopping.wait()
        return response

    return answer


def drop() -> Behaviour:
    """Read the request, then close the connection without a byte: it may have been run."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response()

    return answer


def hang(gate: Gate | None = None, then: Behaviour | None = None) -> Behaviour:
    """Answer nothing until ``gate`` opens (then as ``then``, by default a chat answer), or for ever."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        if gate is None:
            await upstream.stopping.wait()
            return web.Response(status=599)
        await gate.wait()
        return await (then or whole(chat_answer()))(request, seen, upstream)

    return answer


# --- the client's side: one request through the app over ASGI -------------------------------------------


class Exchange:
    """One request through the app, as uvicorn would run it, with the client's moves in the test's hands."""

    def __init__(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.gone = False
        self.send_gate: Gate | None = None  # while closed, the app's sends wait (a client not reading)
        self.sends_waiting = 0  # sends held at that gate now
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._body_done = False
        self._started = asyncio.Event()
        self._complete = asyncio.Event()
        self._hung_up = asyncio.Event()
        self._arrived = asyncio.Event()
        self.task = asyncio.create_task(app(scope, self._receive, self._send))
        self.task.add_done_callback(lambda _: self._arrived.set())  # wakes a wait for a chunk that never comes

    # the client's moves
    def send_body(self, part: bytes, *, more: bool = False) -> None:
        self._inbox.put_nowait({"type": "http.request", "body": part, "more_body": more})

    def hang_up(self) -> None:
        self.gone = True
        self._hung_up.set()
        self._inbox.put_nowait({"type": "http.disconnect"})

    # what it got
    async def started(self) -> Exchange:
        async with asyncio.timeout(BOUND_S):
            await self._started.wait()
        return self

    async def wait_for(self, fragment: bytes) -> Exchange:
        """Until the body received so far holds ``fragment``."""
        async with asyncio.timeout(BOUND_S):
            while fragment not in self.body:
                if self._complete.is_set() or self.task.done():
                    raise AssertionError(f"{fragment!r} never came; the body was {self.body!r}")
                self._arrived.clear()
                await self._arrived.wait()
        return self

    async def done(self) -> Exchange:
        async with asyncio.timeout(BOUND_S):
            await self.task
        return self

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        """The OpenAI-shaped error of the body, its four fields checked."""
        payload = self.json()
        assert set(payload) == {"error"}, payload
        assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
        return payload["error"]

    def events(self) -> list[Any]:
        """The ``data:`` payloads of a streamed body, JSON decoded (``[DONE]`` as the string)."""
        out: list[Any] = []
        for line in self.body.decode().replace("\r\n", "\n").split("\n"):
            if line.startswith("data:"):
                data = line[5:].strip()
                out.append(data if data == "[DONE]" else json.loads(data))
        return out

    # the ASGI side
    async def _receive(self) -> Message:
        if not self._body_done:
            message = await self._inbox.get()
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                self._body_done = True
            return message
        waits = [asyncio.ensure_future(self._hung_up.wait()), asyncio.ensure_future(self._complete.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self.send_gate is not None:
            self.sends_waiting += 1
            try:
                await self.send_gate.wait()
            finally:
                self.sends_waiting -= 1
        if self.gone:
            return  # as uvicorn does: nobody to send it to
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
            self._started.set()
        elif message["type"] == "http.response.body":
            if message.get("body"):
                self.chunks.append(message["body"])
                self._arrived.set()
            if not message.get("more_body", False):
                self._complete.set()


# --- the gateway in process -----------------------------------------------------------------------------

#: Settings every component test starts from: no controller (the limit stays where the test puts it), and the
#: periodic loops run once at start-up and not again during a test.
QUIET = {
    "control_enabled": False,
    "health_interval_s": 3600,
    "metrics_interval_s": 3600,
    "nvml_interval_s": 3600,
    "event_loop_lag_interval_s": 3600,
    "initial_limit": 4,
    "routing": "least_loaded",
}


@asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """Run the app's ASGI lifespan around the block, as a server does: start-up before, shutdown after."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))
    inbox.put_nowait({"type": "lifespan.startup"})
    async with asyncio.timeout(BOUND_S):
        started = await outbox.get()
    assert started["type"] == "lifespan.startup.complete", started
    try:
        yield
    finally:
        inbox.put_nowait({"type": "lifespan.shutdown"})
        async with asyncio.timeout(BOUND_S):
            stopped = await outbox.get()
            await task
        assert stopped["type"] == "lifespan.shutdown.complete", stopped


class GatewayUnderTest:
    """The app of :func:`create_server_app` with its lifespan running, and what a test reads of it."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        # create_server_app's ProxiedRoutes holds the parts; a bare create_app keeps them in its state.
        self.parts: Gateway = app.gateway if hasattr(app, "gateway") else app.state.gateway

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        hold_body: bool = False,
        content_type: str | None = "application/json",
    ) -> Exchange:
        """Start a request; its body is sent whole unless ``hold_body`` (the test sends it with ``send_body``)."""
        if json_body is not None:
            body = json.dumps(json_body).encode()
        raw_headers = {"host": "localhost"}  # a loopback gateway without keys answers only loopback names
        if body is not None:
            if content_type is not None:
                raw_headers["content-type"] = content_type
            if not hold_body:
                raw_headers["content-length"] = str(len(body))
        raw_headers.update({k.lower(): v for k, v in (headers or {}).items()})
        path, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in raw_headers.items()],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "state": {},
        }
        exchange = Exchange(self.app, scope)
        if not hold_body:
            exchange.send_body(body or b"")
        return exchange

    async def call(self, method: str, path: str, **kwargs: Any) -> Exchange:
        return await self.request(method, path, **kwargs).done()

    def chat(self, *, stream: bool = False, headers: dict[str, str] | None = None, **fields: Any) -> Exchange:
        """Start a chat completion for the test model."""
        body = {"model": MODEL, "messages": CHAT, **({"stream": True} if stream else {}), **fields}
        return self.request("POST", "/v1/chat/completions", json_body=body, headers=headers)

    def upstream(self, fake: FakeUpstream | str) -> Upstream:
        return self.parts.pool.by_name[fake if isinstance(fake, str) else fake.url]

    def inflight(self) -> int:
        return sum(upstream.limiter.inflight for upstream in self.parts.pool)

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the app's own Prometheus registry (0 when the series does not exist)."""
        value = self.parts.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def outcomes(self, fake: FakeUpstream) -> dict[str, float]:
        """``sweetspot_upstream_requests_total`` of one upstream by outcome (non-zero ones only)."""
        out: dict[str, float] = {}
        for family in self.parts.metrics.registry.collect():
            if family.name != "sweetspot_upstream_requests":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["upstream"] == fake.url and sample.value:
                    out[sample.labels["outcome"]] = out.get(sample.labels["outcome"], 0) + sample.value
        return out

    def assert_settled(self) -> None:
        """Nothing left over from the requests that ended: no permit held, nobody queued or watched."""
        assert self.inflight() == 0, [(u.url, u.limiter.inflight) for u in self.parts.pool]
        assert self.parts.queue.depth == 0
        assert not self.parts.drain.running
        assert all(t.inflight == 0 and t.queued == 0 for t in self.parts.tenants)


async def until(predicate: Callable[[], bool]) -> None:
    """Until ``predicate()`` holds, checking each time the event loop has run what was ready (the gateway's own
    steps: a queued request reaching the queue, a permit coming back)."""
    async with asyncio.timeout(BOUND_S):
        spins = 0
        while not predicate():
            spins += 1
            await asyncio.sleep(0 if spins < 200 else 0.001)


def refused_url() -> tuple[str, socket.socket]:
    """A loopback URL where nothing listens: a bound socket that never listens refuses every connection.
    The caller keeps the socket (so the port is not reused) and closes it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sock


@dataclass
class Stage:
    """Starts fake upstreams and gateways for one test and stops them all after it (gateways first)."""

    stack: AsyncExitStack
    fakes: list[FakeUpstream] = field(default_factory=list)

    async def upstream(self, *, models: list[str] | None = None) -> FakeUpstream:
        fake = FakeUpstream(models=models)
        await fake.start()
        self.fakes.append(fake)
        self.stack.push_async_callback(fake.close)
        return fake

    async def gateway(self, *upstreams: FakeUpstream | str, app_factory: Callable | None = None, **settings: Any):
        """A gateway in front of ``upstreams`` (fakes or URLs), its lifespan started: the first health poll and
        the first round of every periodic loop have run, so nothing polls during the test."""
        urls = [u if isinstance(u, str) else u.url for u in upstreams]
        resolved = Settings(**{**QUIET, **settings, "upstreams": urls})
        app = (app_factory or create_server_app)(resolved)
        await self.stack.enter_async_context(lifespan(app))
        gateway = GatewayUnderTest(app, resolved)
        # The lifespan polls once before it starts the loops, whose first round polls again: wait for that one.
        first = {upstream.url: upstream.last_health_check for upstream in gateway.parts.pool}
        await until(lambda: all(u.last_health_check != first[u.url] for u in gateway.parts.pool))
        return gateway


@pytest.fixture
async def stage() -> AsyncIterator[Stage]:
    async with AsyncExitStack() as stack:
        yield Stage(stack)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Every component test runs on the loop the server runs on (uvloop, connecting numeric addresses without the
    resolver: ``gateway.common.asgi_server.NumericConnectLoop``), so the upstream client connects as in production."""
    return {"server_loop": NumericConnectLoop}
