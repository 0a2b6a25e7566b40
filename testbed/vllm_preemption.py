"""The controller in the running gateway against a real vLLM whose KV budget preempts, beside static limits in
the same run: what issues #16 (streams) and #24 (whole answers) ask of it, for
``tests/integration/test_controller_vllm.py``, ``bench/controller_vllm.py`` and ``bench/baselines_real.py``.

vLLM runs the generated ``KNEE`` model with a KV budget set in blocks (``--num-gpu-blocks-override``). C is how
many requests of the workload those blocks hold at once: vLLM gives a request whole blocks for its prompt and
output, from all but one block (its null block). Above C vLLM admits more than fit, runs out of blocks as they
grow and preempts: it drops a request's KV and recomputes its prompt and the tokens it had made later. A
static limit of 2C shows that in the same run (``vllm:num_preemptions_total`` rises while it runs).

How much a preemption costs is the workload's prompt: the recomputation is a prefill. With prompts of a few
hundred tokens (as chat histories and retrieved context are) it is dear even on this CPU, and a limit past
the budget loses streams' goodput (their preempted requests miss the TPOT objective), though not whole
answers' throughput; with 32-token prompts it is nearly free and 2C wins (``docs/vllm.md`` has both).

Every configuration is one gateway in front of the same vLLM, run one at a time with vLLM idle between runs,
so ``vllm:generation_tokens_total``'s delta over a run's measured interval is that configuration's throughput.
Streams are compared on goodput within the gateway's objectives (TTFT net of the gateway's queue, TPOT);
whole answers on throughput (their clients see no first token).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import aiohttp

from gateway.control.knee_search.capacity import Footprint, kv_cap
from gateway.control.window import Outcome as RequestOutcome
from gateway.control.window import RequestSample
from gateway.sweep.workload import LengthDist, RequestFactory, Workload, parse_length
from testbed.closed_loop import (
    Objectives,
    limit_of,
    rotated_rounds,
    start_configurations,
    stream_load,
    upstream_state,
    whole_load,
)
from testbed.gateway import Start, metric_value
from testbed.vllm import MODEL

BLOCK = 32
# The workload and budget of the test and of bench/controller_vllm.py: 545-token prompts (vLLM's count of 512
# words) and 96-160-token answers need 23 blocks each at their longest; 264 blocks hold C = 11 of them. All at
# their longest at once they would fill 96% of the 263 usable blocks; out of step they fill about 80% on
# average, under the controller's kv_usage_high (0.95).
PROMPT_WORDS = 512
OUTPUT = "96..160"
KV_BLOCKS = 264
# FAST_CONTROL's ticks, with the default settle, reading and re-probe periods (2 s, 6 s, 30 s). A request here
# lasts 6-8 s (a 545-token prefill, then 96-160 tokens), and a 2-s reading sees where the running requests are in
# their lives more than the limit: just after a step down only decodes run, and the lower limit reads as fast
# as the higher one. At the hard cap the re-probes are steps down (nothing lies above); at FAST_CONTROL's 10 s
# they would take a third of every controller run, which measures the probes' cost, not the controller's
# limit. Convergence is as fast either way: the KV budget's hard cap bounds slow start's first doubling.
DEFAULT_READINGS = {"SWEETSPOT_SETTLE_S": "2", "SWEETSPOT_MEASURE_S": "6", "SWEETSPOT_REPROBE_S": "30"}


@dataclass(frozen=True)
class Budget:
    """The workload and the KV budget, and C: how many of its requests vLLM's blocks hold at once, each at
    its longest (so C of them never preempt, whatever lengths they draw).

    ``output`` is a length spec, ``N`` or ``A..B`` (uniform). Answers of one length, admitted together, end
    together, and the closed loop keeps them in step: the run becomes waves of prefill, then decode, and a run
    of a few seconds measures its phase in those waves as much as the limit. Lengths spread around the mean
    put the requests out of step within a wave or two (docs/vllm.md has the run-to-run spread of each)."""

    prompt_words: int
    prompt_tokens: int  # what vLLM counted for such a prompt (its usage), not the words asked for
    output: str
    kv_blocks: int

    @property
    def output_len(self) -> LengthDist:
        return parse_length(self.output)

    @property
    def longest_output(self) -> int:
        longest = self.output_len.longest
        if longest is None:
            raise ValueError(f"the output length {self.output!r} has no longest: use N or A..B")
        return longest

    @property
    def blocks_each(self) -> int:
        return math.ceil((self.prompt_tokens + self.longest_output) / BLOCK)

    @property
    def c(self) -> int:
        return (self.kv_blocks - 1) // self.blocks_each

    @property
    def fits(self) -> int:
        """How many the gateway's hard cap lets run: the budget's blocks over the requests' KV at a random
        moment of their lives, with three spreads to spare (``capacity.kv_cap``: 12 for the default, where C
        is 11). Static C never preempts; up to this many, out of step, a preemption is rare."""
        outputs = range(self.output_len.shortest, self.longest_output + 1)
        samples = [
            RequestSample(0.0, 0.0, 1.0, 0.1, self.prompt_tokens, output, RequestOutcome.OK) for output in outputs
        ]
        footprint = Footprint.of(samples)
        assert footprint is not None
        return kv_cap(self.kv_blocks * BLOCK, BLOCK, footprint)

    @property
    def workload(self) -> Workload:
        return Workload(api="completions", prompt_len=parse_length(self.prompt_words), output_len=self.output_len)


async def measure_budget(url: str, prompt_words: int, output: str, kv_blocks: int) -> Budget:
    """Ask vLLM how many tokens the workload's prompts come to (its tokenizer's count, not the words)."""
    probe = Workload(api="completions", prompt_len=parse_length(prompt_words), output_len=parse_length(1))
    body = dict(RequestFactory(probe).next().body, model=MODEL, stream=False)
    body.pop("stream_options", None)
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/completions", json=body) as resp:
        usage = (await resp.json())["usage"]
    return Budget(prompt_words, int(usage["prompt_tokens"]), output, kv_blocks)


@dataclass(frozen=True)
class Pace:
    """How long the controller converges, and the rotated rounds after it (each run: warm-up, then measured).

    The warm-up outlasts a run's start-up wave. Each run starts with vLLM idle and every admitted client sending
    at once: the first wave's prefills queue one behind another, so its last requests see a TTFT past the
    objective, and their answers last 5-10 s more; the requests after it start out of step, with a TTFT under
    1 s at C. Measured any earlier, a run's goodput judges how far the machine's speed of the moment pushed that
    wave past the objective, not the limit (docs/vllm.md, "The start-up wave")."""

    converge_s: float = 40.0
    warmup_s: float = 15.0
    measure_s: float = 12.0
    rounds: int = 3

    @property
    def measured_s(self) -> float:
        """The controller's time under load while it is judged (its runs, warm-ups included)."""
        return self.rounds * (self.warmup_s + self.measure_s)


@dataclass
class Outcome:
    """One case's figures, and each of the issues' checks by name (True: met)."""

    compared_on: str
    c: int
    objectives: dict[str, float]
    limit_converging: list[int]
    limit_converged: int
    limit_measured: list[int]
    reasons_measured: dict[str, int]  # the controller's last decision at each look while judged, by reason
    metered_by: str | None
    preemptions: dict[str, float]
    runs: dict[str, list[float]]
    throughput: dict[str, list[float]]
    # Streamed: each run's p99 TTFT net of the queue, of the requests whose first token fell inside its measured part.
    upstream_ttft_p99: dict[str, list[float | None]]
    ratio: dict[str, float]
    limit_changes: list[str]
    spans: list[str]  # each run's configuration and its start and end on the controller's clock (monotonic)
    met: dict[str, bool] = field(default_factory=dict)

    def failed(self) -> list[str]:
        return [check for check, ok in self.met.items() if not ok]

    def summary(self) -> str:
        """The figures that say why a check failed, short enough to lead a report that CI may cut."""
        measured = sorted(set(self.limit_measured))
        return (
            f"ratios {self.ratio}, goodput or throughput per run {self.runs}, limits measured {measured} "
            f"(converged at {self.limit_converged}), reasons {self.reasons_measured}, preemptions {self.preemptions}, "
            f"upstream TTFT p99 per run {self.upstream_ttft_p99}, runs {self.spans}"
        )


def vllm_counter(url: str, name: str) -> float:
    value = metric_value(f"{url}/metrics", name)
    assert value is not None, f"vLLM's /metrics has no {name}"
    return value


async def idle(url: str, timeout: float = 30.0) -> None:
    """Wait until vLLM runs and queues nothing: the clients of the previous run hung up, and until vLLM has
    ended their requests they hold KV blocks (and preempt) under the next run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [
            await asyncio.to_thread(vllm_counter, url, name)
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
        ]
        if not any(busy):
            await asyncio.sleep(1.0)  # a scrape and a tick: the gateways read the counters as they stand now
            return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"vLLM still busy {timeout} s after the clients hung up")


def changes(state: dict) -> list[str]:
    """The controller's limit changes: when (its clock), why, the signals behind it, and what it and the
    backend had running then."""

    def line(d: dict) -> str:
        i = d["inputs"]
        return (
            f"t={d['now']:.1f} {d['previous']}->{d['limit']} {d['reason']} {i.get('signals', '')} "
            f"inflight={i.get('inflight')} peak={i.get('peak_inflight')} queued={i.get('queue_depth')} "
            f"kv={i.get('kv_usage')} backend_running={i.get('backend_running')} "
            f"preempted={i.get('preemptions_total')}"
        )

    return [line(d) for d in state["controller"].get("decisions", []) if d["limit"] != d["previous"]]


async def compare(
    start: Start, vllm_url: str, budget: Budget, *, streamed: bool, pace: Pace, env: Mapping[str, str] | None = None
) -> Outcome:
    """3C closed-loop clients (streamed, or asking for whole answers): the controller converges under them,
    then rotated rounds of the controller, static C and static 2C; what each delivered, and the checks:
    static 2C preempts, the controller settles at or below what the gateway's hard cap lets run
    (``Budget.fits``), sees at most one preemption a minute while
    judged, and delivers at least 0.9x each static limit (the median of its round-by-round ratios) or runs at
    exactly that limit through every measured run (``Comparison.holds``: then the ratio is the machine's noise)."""
    c = budget.c
    gateways = start_configurations(start, vllm_url, (c, 2 * c), env={**DEFAULT_READINGS, **(env or {})})
    controller = gateways["controller"]
    config = upstream_state(controller)["controller"]["config"]
    objectives = Objectives(ttft_s=config["ttft_p99_slo_s"], tpot_s=config["tpot_p99_slo_s"])
    clients = 3 * c
    load = (
        partial(stream_load, model=MODEL, workload=budget.workload, clients=clients, objectives=objectives)
        if streamed
        else partial(whole_load, model=MODEL, workload=budget.workload, clients=clients)
    )
    generated = partial(vllm_counter, vllm_url, "vllm:generation_tokens_total")
    preempted = partial(vllm_counter, vllm_url, "vllm:num_preemptions_total")
    converging: list[int] = []
    await idle(vllm_url)
    await load(
        controller,
        seconds=pace.converge_s,
        warmup_s=0.0,
        tokens=generated,
        on_tick=lambda: converging.append(limit_of(controller)),
    )
    converged_at = limit_of(controller)
    settled: list[int] = []
    reasons: Counter[str] = Counter()

    def look() -> None:
        state = upstream_state(controller)
        settled.append(int(state["limit"]))
        decisions = state["controller"].get("decisions") or [{"reason": "none"}]
        reasons[decisions[-1]["reason"]] += 1

    preemptions: dict[str, float] = {name: 0.0 for name in gateways}
    throughput: dict[str, list[float]] = {name: [] for name in gateways}
    ttft: dict[str, list[float | None]] = {name: [] for name in gateways}
    spans: list[str] = []

    async def run(name: str) -> float:
        watch = look if name == "controller" else None
        await idle(vllm_url)
        before, began = preempted(), time.monotonic()
        result = await load(
            gateways[name], seconds=pace.measure_s, warmup_s=pace.warmup_s, on_tick=watch, tokens=generated
        )
        preemptions[name] += preempted() - before
        spans.append(f"{name} {began:.1f}-{time.monotonic():.1f}")
        throughput[name].append(round(result.tokens_per_s))
        ttft[name].append(None if result.upstream_ttft_p99 is None else round(result.upstream_ttft_p99, 2))
        if not streamed:
            return result.tokens_per_s
        assert result.goodput_per_s is not None
        return result.goodput_per_s

    comparison = await rotated_rounds(list(gateways), pace.rounds, run)
    paired = comparison.paired
    over = f"static {2 * c}"
    met = {
        f"{over} preempts": preemptions[over] > 0,
        f"settles at or below {budget.fits} (C={c})": bool(settled)
        and max(settled) <= budget.fits
        and converged_at <= budget.fits,
        "at most one preemption a minute": preemptions["controller"] <= math.ceil(pace.measured_s / 60),
        **{f">= 0.9x {name}, or at its limit throughout": comparison.holds(name, settled) for name in paired},
    }
    state = upstream_state(controller)
    return Outcome(
        compared_on="goodput" if streamed else "throughput",
        c=c,
        objectives=vars(objectives),
        limit_converging=converging,
        limit_converged=converged_at,
        limit_measured=settled,
        reasons_measured=dict(reasons),
        metered_by=state["controller"]["algorithm"].get("tokens_source"),
        preemptions=preemptions,
        runs={name: [round(v) for v in values] for name, values in comparison.runs.items()},
        throughput=throughput,
        upstream_ttft_p99=ttft,
        ratio={name: round(r, 3) for name, r in paired.items()},
        limit_changes=changes(state),
        spans=spans,
        met=met,
    )
