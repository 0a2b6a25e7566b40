"""Which HTTP client should the gateway use upstream? CPU per request and per streamed chunk, measured.

    .venv/bin/python -m bench.upstream_client                    # against a llama-server it starts
    .venv/bin/python -m bench.upstream_client --upstream URL     # or any OpenAI-compatible server
    .venv/bin/python -m bench.upstream_client --quick            # a smoke run, in seconds

Runs the same requests with aiohttp (one pooled session) and httpx (AsyncClient, pooled), in one
process, interleaved, and reports the client process's CPU seconds per non-streamed request and per
streamed chunk. CPU time, unlike latency, is what the gateway's clients compete for on a small box.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import aiohttp
import httpx
from rich.console import Console
from rich.table import Table

from bench._http import BenchError, dig, get_json
from bench._json import write_json
from bench._quick import add_quick, parse
from gateway.common.resend import resend_if_stale
from gateway.server.upstream.upstream_client import STALE_RETRIES

console = Console()
CONCURRENCY = 16
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py).
QUICK = {"requests": 64, "rounds": 1}


# The gateway sends streamed requests upstream with Connection: close (llama-server closes after every streamed
# reply while announcing keep-alive; pooled, those connections die under the next request), so both clients
# do the same here: the comparison is of the client as the gateway uses it.
STREAM_HEADERS = {"Connection": "close"}


def body(model: str, stream: bool, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


async def with_aiohttp(url: str, model: str, requests: int, stream: bool, max_tokens: int) -> tuple[float, int]:
    chunks = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            nonlocal chunks
            async with await _aiohttp_post(
                session,
                f"{url}/v1/chat/completions",
                body(model, stream, max_tokens),
                STREAM_HEADERS if stream else None,
            ) as resp:
                if resp.status != 200:
                    raise BenchError(f"POST {url}/v1/chat/completions answered {resp.status}: {await resp.text()}")
                if stream:
                    async for _ in resp.content.iter_any():
                        chunks += 1
                else:
                    await resp.read()

        return await _drive(one, requests), chunks


async def _aiohttp_post(
    session: aiohttp.ClientSession, url: str, payload: dict, headers: dict[str, str] | None
) -> aiohttp.ClientResponse:
    """POST as the gateway's proxy does: a request whose pooled connection died before any byte came back is
    sent again."""
    return await resend_if_stale(lambda: session.post(url, json=payload, headers=headers), resends=STALE_RETRIES)


async def with_httpx(url: str, model: str, requests: int, stream: bool, max_tokens: int) -> tuple[float, int]:
    chunks = 0
    limits = httpx.Limits(max_connections=CONCURRENCY * 2, max_keepalive_connections=CONCURRENCY * 2)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one() -> None:
            nonlocal chunks
            if stream:
                async with client.stream(
                    "POST", f"{url}/v1/chat/completions", headers=STREAM_HEADERS, json=body(model, stream, max_tokens)
                ) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        raise BenchError(f"POST {url}/v1/chat/completions answered {resp.status_code}: {resp.text}")
                    async for _ in resp.aiter_raw():
                        chunks += 1
            else:
                resp = await client.post(f"{url}/v1/chat/completions", json=body(model, stream, max_tokens))
                if resp.status_code != 200:
                    raise BenchError(f"POST {url}/v1/chat/completions answered {resp.status_code}: {resp.text}")

        return await _drive(one, requests), chunks


async def _drive(one, requests: int) -> float:
    await one()  # warm-up: connection set-up is not what we compare
    remaining = requests
    cpu0 = time.process_time()

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.process_time() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    add_quick(parser, QUICK)
    args = parse(parser)
    server = None
    if args.upstream:
        url = args.upstream.rstrip("/")
    else:
        from testbed.llama_process import start_near_free_server

        server, url = start_near_free_server(parallel=CONCURRENCY)
    try:
        model = asyncio.run(_model(url))
        results: dict[str, dict[str, list[float]]] = {
            "aiohttp": {"plain": [], "stream": []},
            "httpx": {"plain": [], "stream": []},
        }
        for _ in range(args.rounds):
            for name, fn in (("aiohttp", with_aiohttp), ("httpx", with_httpx)):
                cpu, _ = asyncio.run(fn(url, model, args.requests, False, 1))
                results[name]["plain"].append(cpu / args.requests * 1e3)
                cpu, _ = asyncio.run(fn(url, model, args.requests // 4, True, 32))
                results[name]["stream"].append(cpu / (args.requests // 4) * 1e3)
    finally:
        if server is not None:
            server.stop()
    table = Table(title=f"upstream client CPU (median of {args.rounds} rounds, concurrency {CONCURRENCY})")
    for column in ("client", "ms CPU / non-streamed request", "ms CPU / streamed request (32 tokens)"):
        table.add_column(column)
    summary = {}
    for name, values in results.items():
        plain, stream = statistics.median(values["plain"]), statistics.median(values["stream"])
        summary[name] = {"ms_per_request": round(plain, 3), "ms_per_streamed_request": round(stream, 3)}
        table.add_row(name, f"{plain:.3f}", f"{stream:.3f}")
    console.print(table)
    if args.json:
        write_json(args.json, {"upstream": url, "model": model, **summary}, indent=2)


async def _model(url: str) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        models = await get_json(session, f"{url}/v1/models")
    return dig(models, "data", 0, "id", what=f"GET {url}/v1/models")


if __name__ == "__main__":
    main()
