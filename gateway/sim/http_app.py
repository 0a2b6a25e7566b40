"""The simulator's HTTP face: vLLM's OpenAI-compatible server, backed by the pure engine.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream and non-stream),
``POST /v1/embeddings``, ``GET /v1/models``, ``GET /health``, ``GET /version``, ``GET /metrics``; with LoRA
enabled (``SimConfig.lora``) vLLM's ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``, and each
adapter is a model name of its own (:mod:`gateway.sim.lora`); and, only when built with ``admin=True``,
``GET|POST /admin/scenario`` to change the backend under a running client (slower, smaller KV cache, failing,
stalled). Those last two kinds, the routes that change the server, are :mod:`gateway.sim.server_routes`'.

A client that disconnects aborts its sequence, freeing its KV at once, as vLLM does: for streams
Starlette cancels the response generator, for whole responses a watcher waits for the ASGI
``http.disconnect`` message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.common.asgi_server import serve_app
from gateway.sim import shapes, text
from gateway.sim.engine import Engine, InjectedError
from gateway.sim.exposition import CONTENT_TYPE, VllmMetrics
from gateway.sim.lora import LoraConfig
from gateway.sim.profiles import Profile
from gateway.sim.protocol import (
    BadRequest,
    GenerationRequest,
    check_model,
    parse_embedding_inputs,
    parse_generation,
)
from gateway.sim.request_bodies import read_json, read_json_object
from gateway.sim.runner import EngineRunner, Handle
from gateway.sim.server_routes import add_admin_routes, add_lora_routes


@dataclass(frozen=True, slots=True)
class SimConfig:
    profile: Profile
    model_name: str | None = None  # served name; the profile's model when None
    time_scale: float = 1.0
    seed: int = 0
    admin: bool = False
    eos_mean_tokens: float | None = None
    api_key: str | None = None  # like vLLM's --api-key: /v1/* routes then need ``Bearer <key>``
    prefix_caching: bool = True  # vLLM V1's default; False is its --no-enable-prefix-caching
    lora: LoraConfig | None = None  # vLLM's --enable-lora and its options; None: no adapters

    @property
    def served_model(self) -> str:
        return self.model_name or self.profile.model


def create_sim_app(config: SimConfig) -> FastAPI:
    """Build the app; the engine runner starts and stops with the app's lifespan."""
    profile = config.profile
    served = config.served_model
    engine = Engine(
        profile,
        seed=config.seed,
        eos_mean_tokens=config.eos_mean_tokens,
        prefix_caching=config.prefix_caching,
        lora=config.lora,
    )
    metrics = VllmMetrics(
        profile,
        served,
        prefix_caching=config.prefix_caching,
        max_loras=config.lora.max_loras if config.lora is not None else None,
    )
    state: dict[str, EngineRunner] = {}
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runner = EngineRunner(engine, metrics, time_scale=config.time_scale)
        runner.start()
        state["runner"] = runner
        try:
            yield
        finally:
            await runner.stop()

    app = FastAPI(title="sweetspot simulator", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    if config.api_key:
        app.add_middleware(_RequireApiKey, key=config.api_key)

    def runner() -> EngineRunner:
        return state["runner"]

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(shapes.error_body(exc.message, exc.err_type, exc.status, exc.param), exc.status)

    async def _generate(request: Request, chat: bool) -> Response:
        req = parse_generation(
            await read_json(request),
            chat=chat,
            served_model=served,
            max_model_len=profile.max_model_len,
            adapters=engine.adapters if engine.adapters is not None else (),
        )
        try:
            hashes = text.block_hashes(req.prompt_ids, profile.block_size) if config.prefix_caching else ()
            handle = runner().submit(
                req.prompt_tokens, req.max_tokens, ignore_eos=req.ignore_eos, block_hashes=hashes, lora=req.lora
            )
        except InjectedError as exc:
            status = engine.scenario.error_status
            kind = "ServiceUnavailableError" if status == 503 else "InternalServerError"
            return JSONResponse(shapes.error_body(str(exc), kind, status), status)
        base_id = request.headers.get("x-request-id")
        if req.stream:
            return StreamingResponse(_stream(handle, req, base_id), media_type="text/event-stream")
        return await _whole(request, handle, req, base_id)

    async def _stream(handle: Handle, req: GenerationRequest, base_id: str | None) -> AsyncIterator[str]:
        fmt = shapes.StreamFormat(chat=req.chat, model=req.lora or served, base_id=base_id)
        sent = 0
        try:
            if req.chat:
                yield fmt.role_chunk()
            while True:
                ready, done = handle.ready, handle.done
                if ready > sent:
                    parts = []
                    while sent < ready:
                        final = done and sent == ready - 1 and handle.finish_reason in ("length", "stop")
                        usage = shapes.usage(req.prompt_tokens, sent + 1) if req.continuous_usage else None
                        parts.append(
                            fmt.token(
                                text.word(req.seed, sent),
                                handle.finish_reason if final else None,
                                None if usage is None else _dumps(usage),
                            )
                        )
                        sent += 1
                    yield "".join(parts)
                if done:
                    break
                handle.event.clear()
                await handle.event.wait()
            if handle.finish_reason not in ("length", "stop"):
                err = shapes.error_body(
                    "the request could not be scheduled (KV cache too small)", "InternalServerError", 500
                )
                yield "data: " + _dumps(err) + "\n\n"
            if req.include_usage:
                yield fmt.usage_chunk(req.prompt_tokens, sent)
            yield shapes.DONE
        finally:
            if not handle.done:
                runner().abort(handle)

    async def _whole(request: Request, handle: Handle, req: GenerationRequest, base_id: str | None) -> Response:
        finished = asyncio.ensure_future(handle.wait_done())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not finished.done():
                finished.cancel()
                runner().abort(handle)
        if not handle.done or handle.finish_reason not in ("length", "stop"):
            if not handle.done:
                return Response(status_code=499)  # nobody is listening any more
            return JSONResponse(
                shapes.error_body(
                    "the request could not be scheduled (KV cache too small)", "InternalServerError", 500
                ),
                500,
            )
        body_text = text.generated_text(req.seed, handle.ready)
        build = shapes.chat_response if req.chat else shapes.completion_response
        return JSONResponse(
            build(req.lora or served, body_text, handle.finish_reason, req.prompt_tokens, handle.ready, base_id)
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        inputs, fmt = parse_embedding_inputs(await read_json(request), served)
        data, prompt_tokens = [], 0
        for i, item in enumerate(inputs):
            vec = text.embedding(item, profile.embedding_dim)
            prompt_tokens += text.text_tokens(item)
            data.append(
                {"index": i, "object": "embedding", "embedding": text.embedding_base64(vec) if fmt == "base64" else vec}
            )
        return JSONResponse(
            {
                "id": shapes.request_id("embd"),
                "object": "list",
                "created": int(time.time()),
                "model": served,
                "data": data,
                "usage": shapes.usage(prompt_tokens, 0) | {"prompt_tokens_details": None},
            }
        )

    def relevance(query: str, document: str) -> float:
        """A cross-encoder's score, faked deterministically: the cosine of the two texts' embeddings."""
        a, b = text.embedding(query, profile.embedding_dim), text.embedding(document, profile.embedding_dim)
        return sum(x * y for x, y in zip(a, b, strict=True))

    @app.post("/v1/rerank")
    async def rerank(request: Request) -> Response:
        """vLLM's rerank API (a cross-encoder served with it): documents by relevance to the query."""
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not body.get("documents"):
            raise BadRequest("rerank needs a query and documents")
        check_model(body, served)
        query, documents = body["query"], [str(d) for d in body["documents"]]
        scored = sorted(((relevance(query, doc), i, doc) for i, doc in enumerate(documents)), reverse=True)
        tokens = sum(text.text_tokens(query) + text.text_tokens(doc) for doc in documents)
        return JSONResponse(
            {
                "id": shapes.request_id("rerank"),
                "model": served,
                "usage": {"total_tokens": tokens},
                "results": [
                    {"index": i, "document": {"text": doc}, "relevance_score": score} for score, i, doc in scored
                ],
            }
        )

    @app.post("/v1/score")
    async def score(request: Request) -> Response:
        """vLLM's score API: text_1 against each of text_2."""
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("text_1"), str) or body.get("text_2") is None:
            raise BadRequest("score needs text_1 (a string) and text_2")
        check_model(body, served)
        second = body["text_2"] if isinstance(body["text_2"], list) else [body["text_2"]]
        tokens = sum(text.text_tokens(body["text_1"]) + text.text_tokens(str(t)) for t in second)
        return JSONResponse(
            {
                "id": shapes.request_id("score"),
                "object": "list",
                "model": served,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "data": [
                    {"index": i, "object": "score", "score": relevance(body["text_1"], str(t))}
                    for i, t in enumerate(second)
                ],
            }
        )

    stored: OrderedDict[str, dict[str, Any]] = OrderedDict()  # responses kept for previous_response_id / GET

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        """The Responses API, whole replies only (no streaming): a chat turn whose prompt also counts the
        conversation so far when ``previous_response_id`` names a response stored here, as vLLM keeps them."""
        body = await read_json_object(request)
        if body.get("stream"):
            raise BadRequest("the simulator's /v1/responses does not stream", param="stream")
        previous = body.get("previous_response_id")
        history = 0
        if previous is not None:
            prior = stored.get(str(previous))
            if prior is None:
                raise BadRequest(f"Response with id '{previous}' not found.", param="previous_response_id", status=404)
            history = prior["usage"]["total_tokens"]
        given = body.get("input")
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
        req = parse_generation(
            {"model": body.get("model"), "messages": messages, "max_tokens": body.get("max_output_tokens")},
            chat=True,
            served_model=served,
            max_model_len=profile.max_model_len,
        )
        handle = runner().submit(req.prompt_tokens + history, req.max_tokens, ignore_eos=req.ignore_eos)
        await handle.wait_done()
        if handle.finish_reason not in ("length", "stop"):
            return JSONResponse(
                shapes.error_body(
                    "the request could not be scheduled (KV cache too small)", "InternalServerError", 500
                ),
                500,
            )
        reply = shapes.responses_response(
            served,
            text.generated_text(req.seed, handle.ready),
            handle.finish_reason or "length",
            req.prompt_tokens + history,
            handle.ready,
            previous,
        )
        if body.get("store", True):
            stored[reply["id"]] = reply
            while len(stored) > 10_000:
                stored.popitem(last=False)
        return JSONResponse(reply)

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> Response:
        reply = stored.get(response_id)
        if reply is None:
            raise BadRequest(f"Response with id '{response_id}' not found.", param="response_id", status=404)
        return JSONResponse(reply)

    @app.get("/v1/models")
    async def models() -> Response:
        adapters = engine.adapters.adapters() if engine.adapters is not None else None
        return JSONResponse(shapes.models_response(served, profile.model, profile.max_model_len, created, adapters))

    if engine.adapters is not None:
        add_lora_routes(app, engine)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> Response:
        return JSONResponse({"version": "sweetspot-sim"})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    if config.admin:
        add_admin_routes(app, engine, runner)
    return app


class _RequireApiKey:
    """vLLM's ``--api-key``: every ``/v1/*`` request must carry ``Authorization: Bearer <key>``."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if auth != self.expected:
                await JSONResponse({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _disconnected(request: Request) -> None:
    """Return when the client has gone away (the body has been read, so only disconnect remains)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def serve(config: SimConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM. Prints ``sweetspot sim listening on http://HOST:PORT`` once ready (the
    socket is bound first, so ``port=0`` works: tests and the demo read the port the kernel picked)."""
    p = config.profile

    def banner() -> str:
        return (
            f"profile {p.name}: {p.model} on {p.gpu_name}, {p.num_gpu_blocks} KV blocks of "
            f"{p.block_size} tokens, max_num_seqs {p.max_num_seqs}, time scale {config.time_scale}"
        )

    serve_app(create_sim_app(config), name="sweetspot sim", host=host, port=port, log_level=log_level, banner=banner)
