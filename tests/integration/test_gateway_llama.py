"""The gateway under uvicorn in front of a real llama-server, driven by the real OpenAI SDK.

One chat server (4 slots) and one ``--embeddings`` server behind one gateway serve the module; the tests
that kill or start llama-server get their own pair. What is asserted is what a client or an operator sees:
exact lengths and usage, models routed to the server that serves them, the gateway's token counts equal to
llama-server's own, a hang-up freeing the slot, a dying server turning into an OpenAI-shaped error and an
unready gateway, a loading server answered with 503 + Retry-After that the SDK's retries ride out, and no
request lost to llama-server closing its connections after every streamed reply. Without the binary every
test fails with "run `make llama-server`"; none is skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
import urllib.error
import urllib.request

import httpx
import openai
import pytest

from gateway.common.processes import RunningProcess, free_port
from testbed.gateway import assert_openai_error, get, get_json, metric_value, start_gateway, wait_for
from testbed.llama import MODEL, llama_config, start_llama_server

SLOTS = 4
EMBED_MODEL = "tiny-embed"
CHAT = [{"role": "user", "content": "Say something."}]
LONG = 4000  # max_tokens of a stream that must still be running when the test acts on it
FAST_HEALTH = {"SWEETSPOT_HEALTH_INTERVAL_S": "0.1"}  # the outage tests poll upstream health often
# One ggml thread: two stall each other's barrier whenever another process takes one of two shared cores
# (a 3 s burst took 30 s while another llama-server ran), and nothing here needs the speed.
THREADS = 1


@pytest.fixture(scope="module")
def llama(module_processes) -> RunningProcess:
    return start_llama_server(module_processes, llama_config(parallel=SLOTS, threads=THREADS))


@pytest.fixture(scope="module")
def embed(module_processes) -> RunningProcess:
    # Its own alias: llama-server started with --embeddings still serves completions, so with the chat
    # server's alias the gateway would (rightly) send chat requests to it as well.
    config = dataclasses.replace(
        llama_config(parallel=2, threads=THREADS, embeddings=True, pooling="mean"), alias=EMBED_MODEL
    )
    return start_llama_server(module_processes, config)


@pytest.fixture(scope="module")
def gateway(module_processes, llama, embed) -> str:
    return start_gateway(module_processes, [llama.url, embed.url], "--no-control", "--initial-limit", str(SLOTS)).url


def sdk(base: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base}/v1",
        api_key="unused",
        max_retries=kwargs.pop("max_retries", 0),
        timeout=kwargs.pop("timeout", 120),
        **kwargs,
    )


def busy_slots(llama_url: str) -> int:
    return sum(1 for slot in get_json(f"{llama_url}/slots") if slot["is_processing"])


def upstream_state(gateway: str, url: str) -> dict:
    return next(u for u in get_json(f"{gateway}/state")["upstreams"] if u["url"] == url)


def outcomes(gateway: str, upstream: str, outcome: str) -> float:
    return (
        metric_value(
            f"{gateway}/metrics", "sweetspot_upstream_requests_total", {"upstream": upstream, "outcome": outcome}
        )
        or 0.0
    )


# --- models and routing ----------------------------------------------------------------------------------------------


def test_models_are_listed_and_routed_to_the_server_that_serves_them(llama, embed, gateway) -> None:
    assert [m.id for m in sdk(llama.url).models.list().data] == [MODEL]
    assert [m.id for m in sdk(embed.url).models.list().data] == [EMBED_MODEL]
    assert [m.id for m in sdk(gateway).models.list().data] == [MODEL, EMBED_MODEL]
    assert upstream_state(gateway, llama.url)["models"] == [MODEL]
    assert upstream_state(gateway, embed.url)["models"] == [EMBED_MODEL]

    before = {url: outcomes(gateway, url, "ok") for url in (llama.url, embed.url)}
    for _ in range(3):
        sdk(gateway).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, extra_body={"ignore_eos": True})
    sdk(gateway).embeddings.create(model=EMBED_MODEL, input="hello")
    assert outcomes(gateway, llama.url, "ok") - before[llama.url] == 3
    assert outcomes(gateway, embed.url, "ok") - before[embed.url] == 1

    with pytest.raises(openai.NotFoundError) as err:
        sdk(gateway).chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=2)
    assert assert_openai_error(err.value.body)["code"] == "model_not_found"


# --- chat, completions, embeddings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_generation_has_exact_length_and_usage(gateway, api: str, stream: bool) -> None:
    n = 13
    client = sdk(gateway)
    kwargs = dict(model=MODEL, max_tokens=n, extra_body={"ignore_eos": True})
    create = client.chat.completions.create if api == "chat" else client.completions.create
    kwargs |= {"messages": CHAT} if api == "chat" else {"prompt": "Once upon a time"}
    if not stream:
        reply = create(**kwargs)
        choice = reply.choices[0]
        assert choice.finish_reason == "length"
        assert choice.message.content if api == "chat" else choice.text
        assert reply.usage.completion_tokens == n and reply.usage.prompt_tokens > 0
        return
    pieces, finish, usage = [], None, []
    for chunk in create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for choice in chunk.choices:
            text = choice.delta.content if api == "chat" else choice.text
            if text:
                pieces.append(text)
            finish = choice.finish_reason or finish
    assert finish == "length"
    assert len(pieces) == n  # the tiny model streams one chunk per token, and the gateway passes each on
    assert len(usage) == 1 and usage[0].completion_tokens == n
    # Not asked for: the gateway still asks llama-server for usage, and drops the usage-only chunk on the way
    # back. (llama-server's /v1/completions puts usage into its last text chunk whether asked or not; that
    # chunk is the server's own and passes.)
    plain = list(create(stream=True, **kwargs))
    assert plain and all(chunk.choices for chunk in plain)
    if api == "chat":
        assert all(chunk.usage is None for chunk in plain)


def test_embeddings_through_the_gateway_equal_direct(embed, gateway) -> None:
    texts = ["hello world", "another text"]
    direct = sdk(embed.url, default_headers={"Connection": "close"}).embeddings.create(model=EMBED_MODEL, input=texts)
    proxied = sdk(gateway).embeddings.create(model=EMBED_MODEL, input=texts)
    assert [d.index for d in proxied.data] == [0, 1]
    assert len(proxied.data[0].embedding) == 512  # the tiny model's n_embd
    assert [d.embedding for d in proxied.data] == [d.embedding for d in direct.data]
    assert proxied.usage.prompt_tokens == direct.usage.prompt_tokens > 0


# --- accounting ------------------------------------------------------------------------------------------------------


def llama_counts(url: str) -> tuple[float, float]:
    """(prompt tokens, output tokens) by llama-server's own counters. Its prompt counter leaves out the tokens
    it reused from a slot's cache; usage counts every prompt token, so the two counters are added."""
    metrics = f"{url}/metrics"
    prompt = (metric_value(metrics, "llamacpp:prompt_tokens_total") or 0.0) + (
        metric_value(metrics, "llamacpp:prompt_tokens_cached_total") or 0.0
    )
    return prompt, metric_value(metrics, "llamacpp:tokens_predicted_total") or 0.0


def gateway_counts(gateway: str, upstream: str) -> tuple[float, float]:
    metrics = f"{gateway}/metrics"
    return (
        metric_value(metrics, "sweetspot_prompt_tokens_total", {"upstream": upstream}) or 0.0,
        metric_value(metrics, "sweetspot_output_tokens_total", {"upstream": upstream}) or 0.0,
    )


def test_usage_counted_by_the_gateway_equals_llama_servers_own(llama, gateway) -> None:
    wait_for(lambda: busy_slots(llama.url) == 0, 30, "llama-server idle before counting")
    llama_before, gateway_before = llama_counts(llama.url), gateway_counts(gateway, llama.url)
    client = sdk(gateway)
    usages = []
    for n, stream in [(7, False), (11, True), (1, False), (19, True)]:
        kwargs = dict(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count {n} words."}],
            max_tokens=n,
            extra_body={"ignore_eos": True},
        )
        if stream:
            chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
            usages += [c.usage for c in chunks if c.usage is not None]
        else:
            usages.append(client.chat.completions.create(**kwargs).usage)
    completion = client.completions.create(model=MODEL, prompt="The end", max_tokens=5, extra_body={"ignore_eos": True})
    usages.append(completion.usage)
    # A stream whose client did not ask for usage is counted all the same (the gateway asked for it).
    unasked = list(
        client.completions.create(
            model=MODEL, prompt="The end", max_tokens=9, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert sum(1 for c in unasked for choice in c.choices if choice.text) == 9

    expected_prompt = sum(u.prompt_tokens for u in usages) + completion.usage.prompt_tokens  # same prompt
    expected_output = sum(u.completion_tokens for u in usages) + 9
    assert expected_output == 7 + 11 + 1 + 19 + 5 + 9

    def deltas() -> tuple[tuple[float, float], tuple[float, float]]:
        lc, gc = llama_counts(llama.url), gateway_counts(gateway, llama.url)
        return (
            (lc[0] - llama_before[0], lc[1] - llama_before[1]),
            (gc[0] - gateway_before[0], gc[1] - gateway_before[1]),
        )

    wanted = (expected_prompt, expected_output)
    wait_for(lambda: deltas() == (wanted, wanted), 10, f"llama-server and gateway both counting {wanted}", 0.1)
    assert deltas() == (wanted, wanted)


# --- hang-ups and a burst --------------------------------------------------------------------------------------------


def test_client_hang_up_mid_stream_frees_the_slot_and_the_permit(llama, gateway) -> None:
    wait_for(lambda: busy_slots(llama.url) == 0, 30, "llama-server idle before the test")
    cancelled_before = outcomes(gateway, llama.url, "client_cancelled")
    stream = sdk(gateway).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=LONG, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    for chunk in stream:
        received += sum(1 for choice in chunk.choices if choice.text)
        if received >= 5:
            break
    assert busy_slots(llama.url) == 1
    assert upstream_state(gateway, llama.url)["inflight"] == 1
    hung_up = time.monotonic()
    stream.close()  # the SDK closes the HTTP response: the connection to the gateway goes away
    wait_for(lambda: busy_slots(llama.url) == 0, 5, "llama-server freeing the slot")
    freed_after = time.monotonic() - hung_up
    assert freed_after < 1.0, f"the slot was freed {freed_after:.2f}s after the hang-up"
    assert metric_value(f"{llama.url}/metrics", "llamacpp:requests_processing") == 0
    wait_for(lambda: upstream_state(gateway, llama.url)["inflight"] == 0, 5, "the gateway releasing the permit")
    assert outcomes(gateway, llama.url, "client_cancelled") == cancelled_before + 1


async def test_burst_of_mixed_requests_loses_nothing(llama, gateway) -> None:
    """llama-server closes its connection after every streamed reply while announcing keep-alive, and a queue
    forms and drains in front of its slots: every request must still succeed. (The gateway sends streamed
    requests with ``Connection: close`` so their connections are never pooled, and resends a request whose
    pooled connection died before any byte came back, counted in
    sweetspot_upstream_retries_total{reason="stale_connection"}.)"""
    rng = random.Random(7)
    client = openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=120)
    plan = [(rng.choice(["chat", "completions"]), rng.random() < 0.5, rng.randint(1, 24)) for _ in range(60)]
    ok_before = outcomes(gateway, llama.url, "ok")
    gate = asyncio.Semaphore(3 * SLOTS)  # three times the gateway's limit: a queue forms and drains

    async def one(api: str, stream: bool, n: int) -> int:
        async with gate:
            kwargs = dict(model=MODEL, max_tokens=n, extra_body={"ignore_eos": True})
            if api == "chat":
                create, kwargs = client.chat.completions.create, kwargs | {"messages": CHAT}
            else:
                create, kwargs = client.completions.create, kwargs | {"prompt": "Tell me"}
            if not stream:
                return (await create(**kwargs)).usage.completion_tokens
            tokens = 0
            async for chunk in await create(stream=True, **kwargs):
                tokens += sum(1 for c in chunk.choices if (c.delta.content if api == "chat" else c.text))
            return tokens

    results = await asyncio.gather(*(one(*spec) for spec in plan), return_exceptions=True)
    await client.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert results == [n for _, _, n in plan]
    assert outcomes(gateway, llama.url, "ok") - ok_before == len(plan)
    assert outcomes(gateway, llama.url, "upstream_error") == 0
    retries = (
        metric_value(
            f"{gateway}/metrics",
            "sweetspot_upstream_retries_total",
            {"upstream": llama.url, "reason": "stale_connection"},
        )
        or 0.0
    )
    print(f"stale-connection resends so far: {retries:.0f}")


async def test_many_concurrent_streams_on_a_fast_server_lose_nothing(processes) -> None:
    """Streams at the rate a near-free model serves them, 32 at a time. Each streamed reply leaves llama-server's
    side of its connection closed; when the gateway pooled those connections, a request could draw a dead one on
    every resend and fail with 502 (1 to 5 requests in 800 here), so the gateway asks for streamed requests'
    connections to be closed (``Connection: close``) and never pools them."""
    import aiohttp

    from testbed.llama_process import NEAR_FREE_ALIAS, NEAR_FREE_MODEL
    from testbed.tiny_gguf import ensure_model

    config = dataclasses.replace(
        llama_config(parallel=32, threads=1), model=ensure_model(NEAR_FREE_MODEL), alias=NEAR_FREE_ALIAS
    )
    upstream = start_llama_server(processes, config).url
    gateway = start_gateway(processes, [upstream], "--no-control", "--initial-limit", "32").url
    body = {"model": NEAR_FREE_ALIAS, "messages": CHAT, "max_tokens": 32, "ignore_eos": True, "stream": True}
    failures: list[str] = []
    done = 0

    async def client(session: aiohttp.ClientSession, count: int) -> None:
        nonlocal done
        for _ in range(count):
            async with session.post(f"{gateway}/v1/chat/completions", json=body) as resp:
                text = await resp.text()
            if resp.status != 200 or '"error"' in text or not text.rstrip().endswith("data: [DONE]"):
                failures.append(f"{resp.status}: {text[:200]}")
            done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session, 25) for _ in range(32)))
    assert done == 800 and not failures, failures[:3]
    assert outcomes(gateway, upstream, "upstream_error") == 0
    state = json.loads(urllib.request.urlopen(f"{gateway}/state", timeout=10).read())["upstreams"][0]
    assert state["backend"]["kind"] == "llamacpp" and not state["streams_keep_alive"]  # scraped, still closing


# --- outages: a server killed mid-stream, a server still loading ------------------------------------------------------


def test_llama_server_killed_mid_stream_then_restarted(processes) -> None:
    port = free_port()
    config = llama_config(port=port, parallel=2, threads=THREADS)
    server = start_llama_server(processes, config)
    gateway = start_gateway(processes, [config.base_url], "--no-control", "--initial-limit", "2", env=FAST_HEALTH).url
    stream = sdk(gateway).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=LONG, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            received += sum(1 for choice in chunk.choices if choice.text)
            if received == 5:
                server.popen.kill()  # SIGKILL: no goodbye on the connection
    assert received >= 5
    error = assert_openai_error(err.value.body)
    assert error["code"] == "upstream_disconnected"

    wait_for(lambda: upstream_state(gateway, config.base_url)["inflight"] == 0, 5, "the permit released")
    assert outcomes(gateway, config.base_url, "upstream_error") == 1
    # The gateway stays ready (it answers, with 503 + Retry-After below); /readyz reports the upstream down.
    status, body = wait_for(
        lambda: (r := get(f"{gateway}/readyz"))[1]["any_upstream_healthy"] is False and r,
        10,
        "/readyz reporting the upstream down",
    )
    assert status == 200 and body["ready"] is True and body["upstreams"]["upstream-1"]["error"]  # named, not by URL
    with pytest.raises(openai.InternalServerError) as refused:
        sdk(gateway).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert refused.value.status_code == 503
    assert assert_openai_error(refused.value.body)["code"] == "no_upstream"
    assert refused.value.response.headers.get("retry-after") == "2"

    start_llama_server(processes, config)  # the same port again
    wait_for(lambda: get(f"{gateway}/readyz")[1]["any_upstream_healthy"], 30, "/readyz seeing the upstream back")
    reply = sdk(gateway).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 3
    streamed = list(
        sdk(gateway).chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=3, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert sum(1 for c in streamed for choice in c.choices if choice.delta.content) == 3


def test_requests_while_llama_server_loads_are_retried_by_the_sdk_until_it_serves(processes) -> None:
    """Contract (docs/gateway.md): no healthy upstream -> 503 ``no_upstream`` with ``Retry-After: 2``, which the
    OpenAI SDK honours when it retries. A big context makes llama-server's loading phase last a few seconds
    (it allocates and clears the KV cache), long enough to send a request into it for certain."""
    port = free_port()
    config = llama_config(port=port, parallel=1, ctx_per_slot=32768, threads=THREADS)
    gateway = start_gateway(
        processes, [config.base_url], "--no-control", "--initial-limit", "1", env=FAST_HEALTH, ready=False
    ).url
    server = start_llama_server(processes, config, ready=False)
    _, body = wait_for(  # the status is 503: the condition waited for it
        lambda: (r := get_quietly(f"{config.base_url}/health")) and r[0] == 503 and r,
        60,
        "llama-server answering 503 while it loads",
        0.005,
    )
    assert body == {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
    wait_for(
        lambda: "answered 503" in str(get(f"{gateway}/readyz")[1]["upstreams"]["upstream-1"]["error"]),
        10,
        "the gateway seeing the loading state",
        0.005,
    )

    answers: list[httpx.Response] = []

    def record(response: httpx.Response) -> None:
        response.read()
        answers.append(response)

    client = sdk(gateway, max_retries=10, http_client=httpx.Client(event_hooks={"response": [record]}))
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 4
    assert server.alive()
    assert answers[-1].status_code == 200
    refusals = answers[:-1]
    assert refusals, "the first answer came after loading ended; the loading window was missed"
    print(f"refused {len(refusals)} time(s) while loading, then served")
    for answer in refusals:
        assert answer.status_code == 503
        assert assert_openai_error(answer.json()["error"])["code"] == "no_upstream"
        assert answer.headers["retry-after"] == "2"


def get_quietly(url: str) -> tuple[int, dict] | None:
    """Like :func:`get`, but None while nothing listens yet."""
    try:
        return get(url)
    except (urllib.error.URLError, ConnectionError):
        return None
