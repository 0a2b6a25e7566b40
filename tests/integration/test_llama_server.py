"""A real llama-server on the generated tiny model: the backend adapter against it, and the OpenAI SDK direct.

One server per module (4 slots) keeps the suite fast; the loading-state test starts its own. Without the
binary every test here fails with "run `make llama-server`"; none is skipped.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import select
import time
import urllib.error
import urllib.request

import aiohttp
import openai
import pytest

from gateway.common.processes import free_port
from gateway.telemetry.backends import BackendScraper
from testbed.llama import MODEL, llama_config, start_llama_server

SLOTS = 4
CTX_PER_SLOT = 512
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def llama(module_processes) -> str:
    proc = start_llama_server(module_processes, llama_config(parallel=SLOTS, ctx_per_slot=CTX_PER_SLOT))
    return proc.url


# llama-server closes the connection after every streamed response while announcing keep-alive (see
# test_streamed_response_closes_the_connection); a client reusing it right after fails. Test clients
# therefore ask for a fresh connection per request.
NO_REUSE = {"Connection": "close"}


@pytest.fixture(scope="module")
def client(llama: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llama}/v1", api_key="unused", max_retries=0, timeout=120, default_headers=NO_REUSE)


def get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


# --- the backend adapter -------------------------------------------------------------------------------------------


async def test_scraper_detects_llama_server_and_reads_total_slots(llama: str) -> None:
    async with BackendScraper(llama) as scraper:
        snap = await scraper.scrape()
    assert scraper.kind == "llamacpp"
    assert snap.error is None and snap.healthy is True
    assert snap.total_slots == SLOTS
    assert snap.kv_usage is None  # not reported by llama-server
    assert snap.waiting == 0.0
    assert snap.generation_tokens_total is not None


async def test_requests_processing_rises_under_load_and_falls_after(llama: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{llama}/v1", api_key="unused", max_retries=0, timeout=120, default_headers=NO_REUSE
    )
    started = asyncio.Event()

    async def long_stream() -> None:
        stream = await client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        async for _ in stream:
            started.set()
            if stop.is_set():
                break
        await stream.close()  # hang up: llama-server cancels the task and frees the slot

    stop = asyncio.Event()
    async with BackendScraper(llama, kind="auto") as scraper:
        tasks = [asyncio.create_task(long_stream()) for _ in range(3)]
        await asyncio.wait_for(started.wait(), 60)
        busy = await scraper.scrape()
        deadline = time.monotonic() + 60
        while (busy.running or 0) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            busy = await scraper.scrape()
        assert busy.running == 3, busy
        assert busy.busy_slots == 3  # /slots agrees with llamacpp:requests_processing
        assert busy.total_slots == SLOTS
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        idle = await scraper.scrape()
        deadline = time.monotonic() + 30
        while idle.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            idle = await scraper.scrape()
        assert idle.running == 0 and idle.busy_slots == 0, idle
        assert idle.generation_tokens_total is not None and idle.generation_tokens_total > 0
        assert idle.itl_seconds_sum is not None and idle.itl_seconds_sum > 0
    await client.close()


async def test_scraper_shares_a_session_with_streaming_requests(llama: str) -> None:
    """In the gateway the scraper uses the proxy's session: after each streamed response llama-server has
    closed that pooled connection, and the scrape must still succeed (aiohttp retries an idempotent GET
    on a fresh connection; a POST it would not, which is the proxy's problem)."""
    body = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        scraper = BackendScraper(llama, session=session)
        for _ in range(4):
            async with session.post(f"{llama}/v1/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
            snap = await scraper.scrape()
            assert snap.error is None and snap.total_slots == SLOTS, snap.error
        await scraper.close()
        assert not session.closed  # a session it was given stays its owner's


def test_props_and_slots_describe_the_configuration(llama: str) -> None:
    status, props = get(f"{llama}/props")
    assert status == 200 and isinstance(props, dict)
    assert props["total_slots"] == SLOTS
    status, slots = get(f"{llama}/slots")
    assert status == 200 and isinstance(slots, list) and len(slots) == SLOTS
    assert all(slot["n_ctx"] == CTX_PER_SLOT for slot in slots)


def test_health_is_503_while_the_model_loads(processes) -> None:
    """llama-server opens its port before loading the model and answers 503 "Loading model" until done.

    On this machine the window lasts 0.3-0.8 s (hundreds of 503 answers at this polling rate), mostly
    creating the context; the port is polled from the moment the process starts.
    """
    port = free_port()
    cfg = llama_config(port=port)
    proc = start_llama_server(processes, cfg, ready=False)
    seen: list[tuple[int, object]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            seen.append(get(f"{cfg.base_url}/health"))
        except (urllib.error.URLError, ConnectionError):
            assert proc.alive(), proc.output()[-2000:]
            time.sleep(0.002)
            continue
        if seen[-1][0] == 200:
            break
    statuses = [s for s, _ in seen]
    assert statuses and statuses[-1] == 200, (statuses[-5:], proc.output()[-2000:])
    loading = [body for s, body in seen if s == 503]
    assert loading, f"never saw the loading state; statuses: {statuses[:5]}"
    assert loading[0] == {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
    assert set(statuses) <= {503, 200}


def test_streamed_response_closes_the_connection(llama: str) -> None:
    """A quirk every client of llama-server (the gateway's proxy included) must handle: after a streamed
    response the server closes the TCP connection, although its headers announce ``Keep-Alive``. A
    non-streamed response leaves the connection open for the next request."""
    host, port = llama.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for stream in (False, True):
            body = json.dumps({"prompt": "hi", "max_tokens": 4, "ignore_eos": True, "stream": stream})
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200 and resp.getheader("Keep-Alive") and not resp.will_close
            readable, _, _ = select.select([conn.sock], [], [], 2.0)
            if not stream:
                assert not readable, "the connection should stay open after a plain response"
            else:
                assert readable and conn.sock.recv(1) == b"", "expected the server to close after streaming"
    finally:
        conn.close()


# --- the OpenAI SDK, direct ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 17])
def test_chat_non_stream_length_and_usage(client: openai.OpenAI, n: int) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=n, extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == n
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + n
    assert resp.choices[0].message.content


def test_chat_stream_one_chunk_per_token_and_usage(client: openai.OpenAI) -> None:
    n = 24
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=n,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == n
    # The tiny model's vocabulary decodes every token to printable ASCII, so nothing is held back.
    assert len(pieces) == n, pieces


def test_completions_non_stream_and_stream(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="The", max_tokens=9, extra_body={"ignore_eos": True})
    assert resp.usage is not None and resp.usage.completion_tokens == 9
    assert resp.choices[0].finish_reason == "length" and resp.choices[0].text

    stream = client.completions.create(
        model=MODEL,
        prompt="The",
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        texts += [c.text for c in chunk.choices if c.text]
    assert len(texts) == 9
    assert usage is not None and usage.completion_tokens == 9


def test_models_lists_the_alias(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_embeddings_variant(processes) -> None:
    proc = start_llama_server(processes, llama_config(embeddings=True, pooling="mean", parallel=2))
    emb = openai.OpenAI(
        base_url=f"{proc.url}/v1", api_key="unused", max_retries=0, timeout=60, default_headers=NO_REUSE
    )
    resp = emb.embeddings.create(model=MODEL, input=["hello world", "another text"])
    assert [d.index for d in resp.data] == [0, 1]
    assert len(resp.data[0].embedding) == 512  # the tiny model's n_embd
    assert resp.data[0].embedding != resp.data[1].embedding
    assert resp.usage.prompt_tokens > 0
