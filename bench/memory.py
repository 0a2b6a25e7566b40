"""Memory: the gateway's RSS with its queue full of large requests and large whole answers in flight, under a
bound derived from its byte settings.

Three settings bound what requests and answers can make the gateway hold: ``max_body_bytes`` per request
body, ``max_queued_bytes`` for all the bodies waiting for a permit together (past it a 429 with Retry-After),
and ``max_response_bytes`` per whole (not streamed) answer (past it a 502 ``response_too_large``). This bench
runs a real ``sweetspot serve`` in front of :class:`testbed.fault_upstream.FaultUpstream` and, for each
configuration, side by side in one run:

1. ``answers`` clients ask for whole answers of ``answer_bytes`` each; the upstream holds them (mode
   ``held:big:<bytes>``), so they take every permit (``--no-control --initial-limit answers``).
2. ``requests`` clients POST chat completions of ``body_bytes`` each (just under ``max_body_bytes``; many
   short messages, so a parsed tree of one would cost several times its bytes), ``uploads`` (8) being sent at
   once: a request is sent once fewer than that are sent and neither queued nor answered (``/state``'s queue
   depth). None can get a permit: each queues, or gets the 429 once the bodies waiting and arriving would pass
   ``max_queued_bytes``: a body declaring its length (64 KiB or more) is held in that budget whole as soon as
   its head arrives, so bodies being received count as well as waiting ones (``--uploads 64`` sends all at
   once).
3. With the queue full, the upstream lets the answers go: each a chat completion sent with chunked encoding
   (no content-length for the gateway to refuse it by), its ``usage`` last. The gateway reads each up to
   ``max_response_bytes`` (a 502 past it) and passes it on; then the queued requests are served.

The gateway's VmRSS is sampled every 20 ms throughout, and its VmHWM (the kernel's peak) read at the end.
The configurations: ``defaults`` (the settings' defaults: most queued requests get the 429, the answers the
502) and ``raised`` (limits that admit all of it: the RSS with the queue full, over the bytes queued, is the
cost of a waiting byte).

The bound, per configuration (every term from the settings and the scenario's counts, none fitted):

    idle RSS (after start and two small requests)
    + request bytes: min(requests x body_bytes, max_queued_bytes + uploads x 64 KiB) (each body held once,
      arriving or waiting, within max_queued_bytes; a connection may buffer up to 64 KiB the budget does not
      hold yet) + max_body_bytes (the join of one received body: bodies are joined one at a time, on the event
      loop) + answers x max_body_bytes (the transport's copy of the bodies being sent upstream, one per
      permit)
    + answers x min(answer_bytes, max_response_bytes) x 3 (while read: the chunks and their join; while sent:
      the answer, the slice Python 3.11's asyncio transport makes of what the socket did not take at once, and
      the bytearray it buffers that in)
    + 64 MiB (the allocator's slack, and the buffers of the clients' connections)

    .venv/bin/python -m bench.memory                          # 64 x 16 MiB queued, 4 x 150 MB answers
    .venv/bin/python -m bench.memory --json docs/memory.json  # the recorded run (docs/gateway.md)
    .venv/bin/python -m bench.memory --quick                  # a smoke run: 8 x 1 MiB, 2 x 8 MB, in seconds

Exits 1 when a configuration's peak RSS is over its bound or a figure is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench._http import admin_headers, dig, get_json
from bench._json import write_json
from bench._procs import gateway_cmd, start
from bench._quick import add_quick, parse
from gateway.common.processes import LISTENING
from gateway.server.routes.inbound import HOLD_DECLARED_FROM
from gateway.settings import Settings
from testbed.fault_upstream import MODEL, FaultUpstream, big_answer

MIB = 1024 * 1024
MB = 1_000_000
#: Per answer in flight: the chunks read and their join, or the answer, a slice and a buffered copy of it.
ANSWER_COPIES = 3
MARGIN_BYTES = 64 * MIB
SAMPLE_S = 0.02
DEFAULTS = {
    name: Settings.model_fields[name].default for name in ("max_body_bytes", "max_queued_bytes", "max_response_bytes")
}
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): the full run divided by 16, with
#: a queue budget of 4 bodies and an answer cap of half an answer in ``defaults``, so both refusals happen.
QUICK = {
    "requests": 8,
    "body_bytes": MIB - 4096,
    "answers": 2,
    "answer_bytes": 8 * MB,
    "max_body_bytes": MIB,
    "max_queued_bytes": 4 * MIB,
    "max_response_bytes": 4 * MIB,
    "raised_queued_bytes": 12 * MIB,
    "raised_response_bytes": 16 * MIB,
}


@dataclass
class Sampler:
    """The gateway's VmRSS every ``SAMPLE_S``; its VmHWM (the kernel's own peak) on demand."""

    pid: int
    samples: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, VmRSS MiB)
    started: float = field(default_factory=time.monotonic)

    def read(self, key: str = "VmRSS") -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"/proc/{self.pid}/status has no {key}")

    async def run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self.started, self.read()))
            await asyncio.sleep(SAMPLE_S)


def chat_body(nbytes: int, fault: str | None = None) -> bytes:
    """A chat completion request of exactly ``nbytes`` bytes: short user messages, the last one padded."""
    message = json.dumps({"role": "user", "content": "m" * 160}).encode()
    head = json.dumps({"model": MODEL, "max_tokens": 1, **({"fault": fault} if fault else {})}).encode()[:-1]
    head += b', "messages": ['
    count = max(0, (nbytes - len(head) - 200) // (len(message) + 1))
    body = head + b",".join([message] * count) + (b"," if count else b"")
    pad = nbytes - len(body) - len(b'{"role": "user", "content": ""}]}')
    body += json.dumps({"role": "user", "content": "m" * max(0, pad)}).encode() + b"]}"
    return body


async def wait_until(predicate: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.02)


class Run:
    """One configuration: a gateway, a fake upstream, the clients, and what they saw."""

    def __init__(self, name: str, limits: dict[str, int], args: argparse.Namespace, body: bytes) -> None:
        self.name = name
        self.limits = limits
        self.args = args
        self.body = body
        self.outcomes: Counter[str] = Counter()
        self.answered = 0  # queue clients with their answer (any status)
        self.answer_bytes: list[int] = []  # bytes of each 200 whole answer the clients read
        self.unexpected: dict[str, str] = {}  # the first body of each unexpected answer, by its outcome

    async def post_queued(self, session: aiohttp.ClientSession, url: str) -> None:
        try:
            async with session.post(url, data=self.body, headers={"content-type": "application/json"}) as response:
                text = await response.text()
                if response.status == 200:
                    self.outcomes["queued_served"] += 1
                elif response.status == 429 and response.headers.get("retry-after"):
                    self.outcomes["refused_429_retry_after"] += 1
                else:
                    self.outcomes[f"queued_other_{response.status}"] += 1
                    self.unexpected.setdefault(f"queued_other_{response.status}", text[:300])
        except aiohttp.ClientError as exc:
            # The gateway refuses a body that does not fit its byte budget as soon as its head arrives (a 429,
            # then the connection closed): a client still writing the body may see the close, not the answer.
            self.outcomes["refused_closed_while_sending"] += 1
            self.unexpected.setdefault("refused_closed_while_sending", f"{type(exc).__name__}: {exc}"[:300])
        self.answered += 1

    async def post_answer(self, session: aiohttp.ClientSession, url: str) -> None:
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "a long answer"}],
                "fault": f"held:big:{self.args.answer_bytes}",
            }
        )
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
            if response.status == 200:
                size = 0
                async for chunk in response.content.iter_chunked(1024 * 1024):  # counted, not kept
                    size += len(chunk)
                self.answer_bytes.append(size)
                self.outcomes["answer_200"] += 1
                return
            text = await response.text()
            if response.status == 502 and "response_too_large" in text:
                self.outcomes["answer_502_too_large"] += 1
            else:
                self.outcomes[f"answer_other_{response.status}"] += 1
                self.unexpected.setdefault(f"answer_other_{response.status}", text[:300])

    async def run(self) -> dict[str, Any]:
        args, limits = self.args, self.limits
        upstream = FaultUpstream()
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in limits.items()]
        cmd = gateway_cmd(
            upstream.url,
            "--no-control",
            f"--initial-limit={args.answers}",
            "--max-queue=100000",
            "--queue-timeout-s=600",
            "--log-level=warning",
            *flags,
        )
        proc, gw = start(cmd, LISTENING)
        url = f"{gw}/v1/chat/completions"
        sampler = Sampler(proc.pid)
        sampling = asyncio.create_task(sampler.run())
        figures: dict[str, Any] = {}
        try:
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=None)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                for _ in range(2):  # the first requests import and connect what the gateway needs
                    async with session.post(
                        url, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                    ):
                        pass
                await asyncio.sleep(1.0)
                figures["idle_rss_mib"] = sampler.read()
                answers = [asyncio.create_task(self.post_answer(session, url)) for _ in range(args.answers)]
                await wait_until(lambda: upstream.held == args.answers, "the answers to take every permit")
                # A request is uploaded once it waits in the queue or has its answer (the 429): at most
                # `uploads` are sent and not yet either.
                queued: list[asyncio.Task[None]] = []
                began = time.monotonic()
                while True:
                    state = await get_json(session, f"{gw}/state", headers=admin_headers())
                    depth = dig(state, "queue", "depth", what="/state")
                    settled = depth + self.answered
                    if settled >= args.requests:
                        break
                    while len(queued) < min(args.requests, settled + args.uploads):
                        queued.append(asyncio.create_task(self.post_queued(session, url)))
                    if time.monotonic() - began > 300:
                        raise RuntimeError(f"the queue did not settle: {self.outcomes}, /state queue {state['queue']}")
                    await asyncio.sleep(0.05)
                figures["upload_s"] = round(time.monotonic() - began, 1)
                await asyncio.sleep(0.5)
                figures["queue_depth"] = depth
                figures["queued_mib"] = round(depth * len(self.body) / MIB, 1)
                figures["queue_rss_mib"] = sampler.read()
                figures["peak_before_answers_mib"] = sampler.read("VmHWM")
                upstream.release()
                await asyncio.gather(*answers, *queued)
                await asyncio.sleep(1.0)
                figures["after_rss_mib"] = sampler.read()
                figures["peak_rss_mib"] = sampler.read("VmHWM")
        finally:
            sampling.cancel()
            proc.stop()
            upstream.close()
        return self.report(figures, sampler)

    def report(self, figures: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
        args, limits = self.args, self.limits
        held_at_most = limits["max_queued_bytes"] + args.uploads * HOLD_DECLARED_FROM
        requests_bytes = min(args.requests * len(self.body), held_at_most)
        terms = {
            "idle_rss": figures["idle_rss_mib"] * MIB,
            "request_bodies": requests_bytes + limits["max_body_bytes"] + args.answers * limits["max_body_bytes"],
            "answers": args.answers * min(args.answer_bytes, limits["max_response_bytes"]) * ANSWER_COPIES,
            "margin": MARGIN_BYTES,
        }
        bound = sum(terms.values()) / MIB
        queued = figures["queued_mib"]
        peak = figures["peak_rss_mib"]
        return {
            "name": self.name,
            "limits": limits,
            "requests": args.requests,
            "body_bytes": len(self.body),
            "uploads_at_once": args.uploads,
            "answers": args.answers,
            "answer_bytes": args.answer_bytes,
            "outcomes": dict(sorted(self.outcomes.items())),
            "unexpected": self.unexpected,
            "answer_bytes_received": self.answer_bytes,
            "upload_s": figures["upload_s"],
            "queue_depth": figures["queue_depth"],
            "queued_mib": queued,
            "idle_rss_mib": round(figures["idle_rss_mib"], 1),
            "queue_rss_mib": round(figures["queue_rss_mib"], 1),
            "rss_per_queued_byte": round((figures["queue_rss_mib"] - figures["idle_rss_mib"]) / queued, 2)
            if queued
            else None,
            "peak_before_answers_mib": round(figures["peak_before_answers_mib"], 1),
            "peak_rss_mib": round(peak, 1),
            "peak_sampled_mib": round(max(rss for _, rss in sampler.samples), 1),
            "after_rss_mib": round(figures["after_rss_mib"], 1),
            "bound_mib": round(bound, 1),
            "bound_terms_mib": {name: round(value / MIB, 1) for name, value in terms.items()},
            "passed": peak <= bound,
            "rss_mib": [
                [round(t, 2), round(rss, 1)] for t, rss in sampler.samples[:: max(1, len(sampler.samples) // 400)]
            ],
        }


def expected(result: dict[str, Any]) -> list[str]:
    """What a run must show beyond the bound: every client answered as its configuration says."""
    problems = []
    outcomes = result["outcomes"]
    refused = outcomes.get("refused_429_retry_after", 0) + outcomes.get("refused_closed_while_sending", 0)
    admitted = outcomes.get("queued_served", 0) + refused
    answered = outcomes.get("answer_200", 0) + outcomes.get("answer_502_too_large", 0)
    if admitted != result["requests"] or answered != result["answers"]:
        problems.append(f"{result['name']}: unexpected outcomes {outcomes}")
    too_large = result["answer_bytes"] > result["limits"]["max_response_bytes"]
    if outcomes.get("answer_502_too_large" if too_large else "answer_200", 0) != result["answers"]:
        problems.append(f"{result['name']}: answers of {result['answer_bytes']} bytes ended {outcomes}")
    if result["queue_depth"] != outcomes.get("queued_served", 0):
        problems.append(f"{result['name']}: {result['queue_depth']} queued but {outcomes} served")
    return problems


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | max_queued_bytes | max_response_bytes | queued then served | 429 + Retry-After "
        "| answers 200 | answers 502 | queued MiB | idle RSS | RSS, queue full | RSS per queued byte "
        "| peak RSS (VmHWM) | bound | |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        o = r["outcomes"]
        refused = o.get("refused_429_retry_after", 0) + o.get("refused_closed_while_sending", 0)
        lines.append(
            f"| {r['name']} | {r['limits']['max_queued_bytes'] / MIB:g} MiB | "
            f"{r['limits']['max_response_bytes'] / MIB:g} MiB | {o.get('queued_served', 0)} | "
            f"{refused} | {o.get('answer_200', 0)} | {o.get('answer_502_too_large', 0)} | "
            f"{r['queued_mib']:g} | {r['idle_rss_mib']:g} MiB | {r['queue_rss_mib']:g} MiB | "
            f"{r['rss_per_queued_byte']} | "
            f"{r['peak_rss_mib']:g} MiB | {r['bound_mib']:g} MiB | {'PASS' if r['passed'] else 'FAIL'} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    configurations = {
        "defaults": {
            "max_body_bytes": args.max_body_bytes,
            "max_queued_bytes": args.max_queued_bytes,
            "max_response_bytes": args.max_response_bytes,
        },
        "raised": {
            "max_body_bytes": args.max_body_bytes,
            "max_queued_bytes": args.raised_queued_bytes,
            "max_response_bytes": args.raised_response_bytes,
        },
    }
    body = chat_body(args.body_bytes)
    await asyncio.to_thread(big_answer, args.answer_bytes)  # built once, before any gateway is measured
    results = []
    for name, limits in configurations.items():
        print(f"{name}: {limits}", flush=True)
        results.append(await Run(name, limits, args, body).run())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64, help="clients whose requests must queue")
    parser.add_argument("--body-bytes", type=int, default=16 * MIB - 4096, help="each queued request's body")
    parser.add_argument(
        "--uploads", type=int, default=8, help="requests being sent at once (sent, and neither queued nor answered)"
    )
    parser.add_argument("--answers", type=int, default=4, help="whole answers in flight at once (the limit)")
    parser.add_argument("--answer-bytes", type=int, default=150 * MB)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULTS["max_body_bytes"])
    parser.add_argument("--max-queued-bytes", type=int, default=DEFAULTS["max_queued_bytes"], help="'defaults'")
    parser.add_argument("--max-response-bytes", type=int, default=DEFAULTS["max_response_bytes"], help="'defaults'")
    parser.add_argument("--raised-queued-bytes", type=int, default=1536 * MIB, help="'raised'")
    parser.add_argument("--raised-response-bytes", type=int, default=256 * MIB, help="'raised'")
    parser.add_argument("--json", type=Path)
    add_quick(parser, QUICK)
    args = parse(parser)
    if args.body_bytes > args.max_body_bytes:
        parser.error("--body-bytes must be at most --max-body-bytes: the requests must be admitted to queue")
    results = asyncio.run(main_async(args))
    print(table(results))
    for r in results:
        terms = ", ".join(f"{k} {v:g}" for k, v in r["bound_terms_mib"].items())
        print(f"{r['name']}: bound {r['bound_mib']:g} MiB = {terms}; outcomes {r['outcomes']}")
    problems = [p for r in results for p in expected(r)]
    problems += [
        f"{r['name']}: peak RSS {r['peak_rss_mib']} MiB over its bound {r['bound_mib']} MiB"
        for r in results
        if not r["passed"]
    ]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python -m bench.memory", *sys.argv[1:]])
        write_json(args.json, {"command": command, "configurations": results}, indent=2)
    for problem in problems:
        print("FAIL:", problem)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
