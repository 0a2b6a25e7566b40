"""Prefix-aware routing in front of two real llama-server processes: a conversation goes back to its cache.

Each llama-server has one slot, and a slot keeps the KV cache of the last prompt it processed; a request whose
prompt starts with that prompt reuses it and prefills only the rest (llama-server reports it per reply:
``timings.cache_n`` tokens reused, ``timings.prompt_n`` prefilled). Two conversations with long histories
take turns, one request at a time, so both servers are idle at every decision:

* ``--routing prefix``: the two conversations start on different servers (ties go to the upstream chosen least
  recently) and every later turn returns to its own, so each turn reuses the whole previous prompt;
* ``--routing least_loaded``: every turn goes to the first idle server, the two conversations evict each
  other's cache there, and every turn prefills its whole history again.

What is asserted is what the servers report (tokens reused and prefilled, requests per server) and the
gateway's routing metrics; the prefill saved is what makes the time to first token lower, and how much lower
is measured in ``bench/routing.py``, not asserted here on a shared machine.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from gateway.common.processes import RunningProcess
from testbed.gateway import get_json, metric_value, start_gateway
from testbed.llama import MODEL, llama_config, start_llama_server

TURNS = 3
THREADS = 1  # two servers on a shared 2-core machine: one ggml thread each


@pytest.fixture(scope="module")
def servers(module_processes) -> list[RunningProcess]:
    config = llama_config(parallel=1, threads=THREADS, ctx_per_slot=4096)
    return [start_llama_server(module_processes, config) for _ in range(2)]


def chat(url: str, messages: list[dict[str, str]]) -> dict:
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())


def converse(gateway: str, tag: str) -> list[tuple[str, int, int, int]]:
    """Two conversations taking turns; per reply (conversation, prompt tokens, reused, prefilled)."""
    histories = {
        name: [{"role": "system", "content": f"{tag}: you are assistant {name}. " + f"{name} remembers. " * 80}]
        for name in ("alpha", "omega")
    }
    replies = []
    for turn in range(TURNS):
        for name, messages in histories.items():
            messages.append({"role": "user", "content": f"turn {turn} of {name}: tell me more about it."})
            answer = chat(gateway, messages)
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            timings = answer["timings"]
            replies.append((name, answer["usage"]["prompt_tokens"], timings["cache_n"], timings["prompt_n"]))
    return replies


def served(gateway: str, upstream: str) -> float:
    return (
        metric_value(f"{gateway}/metrics", "sweetspot_upstream_requests_total", {"upstream": upstream, "outcome": "ok"})
        or 0.0
    )


def follow_ups(replies: list[tuple[str, int, int, int]]) -> list[tuple[int, int, int]]:
    """For each turn after a conversation's first: (previous prompt tokens, reused, prefilled)."""
    previous: dict[str, int] = {}
    out = []
    for name, prompt, reused, prefilled in replies:
        if name in previous:
            out.append((previous[name], reused, prefilled))
        previous[name] = prompt
    return out


def test_prefix_routing_sends_each_turn_back_to_the_server_holding_its_history(module_processes, servers) -> None:
    urls = [s.url for s in servers]
    prefix = start_gateway(module_processes, urls, "--no-control", "--initial-limit", "1", "--routing", "prefix").url
    replies = converse(prefix, "first run")
    assert replies[0][1] > 800  # a long history: prefill is most of the work
    later = follow_ups(replies)
    assert len(later) == 2 * (TURNS - 1)
    for previous_prompt, reused, prefilled in later:
        assert reused >= previous_prompt, later  # the whole previous prompt came from the slot's cache
        assert prefilled < 60, later  # only the new turn was prefilled
    assert [served(prefix, url) for url in urls] == [TURNS, TURNS]  # one conversation per server
    decisions = {
        reason: metric_value(f"{prefix}/metrics", "sweetspot_routing_decisions_total", {"reason": reason})
        for reason in ("prefix", "least_loaded", "load")
    }
    assert decisions == {"prefix": 2 * (TURNS - 1), "least_loaded": 2, "load": None}, decisions
    routing = get_json(f"{prefix}/state")["routing"]
    assert routing["policy"] == "prefix" and routing["prefix_map_max"] == 200_000
    assert 10 <= routing["prefix_map_entries"] <= 40  # each conversation's chunks, kept once
    assert metric_value(f"{prefix}/metrics", "sweetspot_routing_prefix_map_entries") == routing["prefix_map_entries"]
    for url in urls:  # the estimate per upstream: every chunk of every follow-up expected in the cache
        chunks = metric_value(f"{prefix}/metrics", "sweetspot_routing_prefix_chunks_total", {"upstream": url})
        hits = metric_value(f"{prefix}/metrics", "sweetspot_routing_prefix_hit_chunks_total", {"upstream": url})
        assert chunks and hits and 0.3 < hits / chunks < 1.0, (chunks, hits)

    # the same conversations (new texts, so nothing is cached from above) with least-loaded routing
    least = start_gateway(
        module_processes, urls, "--no-control", "--initial-limit", "1", "--routing", "least_loaded"
    ).url
    replies_ll = converse(least, "second run")
    later_ll = follow_ups(replies_ll)
    assert [served(least, url) for url in urls] == [2 * TURNS, 0]  # every turn to the first idle server
    for previous_prompt, reused, _ in later_ll:
        assert reused < previous_prompt / 4, later_ll  # the other conversation had taken the slot
    prefilled_prefix = sum(p for *_, p in later)
    prefilled_least = sum(p for *_, p in later_ll)
    assert prefilled_prefix * 10 < prefilled_least, (prefilled_prefix, prefilled_least)
