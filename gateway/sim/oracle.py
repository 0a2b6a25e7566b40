"""The oracle: what a closed-loop benchmark *should* measure against a profile.

``predict_closed_loop`` runs the pure engine on virtual time with N clients that each send a
request, wait for the whole answer, and send the next one (optionally after a think time).
The concurrency sweep and the controller tests compare what they measure against it, so it
uses the same engine the HTTP simulator does, not a separate formula.

Measurement window: from the moment every client has finished ``warmup_requests`` requests
to the moment every client has finished ``warmup_requests + measure_requests``. With clients
that start together and never get preempted this is a whole number of request cycles, so the
prefill bursts at cycle starts are neither over- nor under-counted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from gateway.sim.engine import Engine
from gateway.sim.profiles import Profile


@dataclass(frozen=True, slots=True)
class ClosedLoopPrediction:
    """Steady-state numbers for one concurrency level (vLLM ``bench serve`` definitions)."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    tokens_per_s: float  # output tokens per second, all clients together
    requests_per_s: float
    ttft_mean_s: float
    ttft_p99_s: float
    tpot_mean_s: float  # (e2e - ttft) / (output_tokens - 1), averaged over requests
    tpot_p99_s: float
    e2e_mean_s: float
    preemptions: int  # during the window
    kv_usage_max: float  # highest KV usage seen during the window
    window_s: float


def predict_closed_loop(
    profile: Profile,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    *,
    seed: int = 0,
    warmup_requests: int = 1,
    measure_requests: int = 4,
    think_time_s: float = 0.0,
    speed_factor: float = 1.0,
) -> ClosedLoopPrediction:
    """Predict closed-loop throughput and latency of ``concurrency`` clients on ``profile``.

    Every request has exactly ``prompt_tokens`` in and ``output_tokens`` out (``ignore_eos``).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    engine = Engine(profile, seed=seed)
    if speed_factor != 1.0:
        engine.set_scenario(speed_factor=speed_factor)
    target = warmup_requests + measure_requests
    done_count = [0] * concurrency
    owner: dict[int, int] = {}
    arrivals: list[tuple[float, int]] = [(0.0, c) for c in range(concurrency)]  # (time, client)
    heapq.heapify(arrivals)
    t = 0.0
    t0: float | None = None
    t1: float | None = None
    warm_left = concurrency  # clients that have not finished their warm-up yet
    all_left = concurrency
    tokens_in_window = 0
    preempt_start = 0
    kv_max = 0.0
    finished_in_window: list[int] = []
    while t1 is None:
        at = engine.next_step_at(t)
        if arrivals and (at is None or arrivals[0][0] <= at):
            when, client = heapq.heappop(arrivals)
            t = max(t, when)
            sid = engine.submit(prompt_tokens, output_tokens, t, ignore_eos=True)
            owner[sid] = client
            continue
        if at is None:
            raise RuntimeError("closed loop went idle; no client has a request in flight")
        res = engine.step(at)
        if res is None:
            raise RuntimeError("engine made no progress in the closed loop")
        t = res.end
        if t0 is not None:
            tokens_in_window += len(res.tokens)
            kv_max = max(kv_max, engine.kv_usage)
        for sid in res.finished:
            client = owner.pop(sid)
            done_count[client] += 1
            if done_count[client] == warmup_requests:
                warm_left -= 1
                if warm_left == 0:
                    t0 = t
                    preempt_start = engine.num_preemptions
            elif t0 is not None and done_count[client] > warmup_requests and engine.seq(sid).arrival >= t0:
                finished_in_window.append(sid)
            if done_count[client] == target:
                all_left -= 1
                if all_left == 0:
                    t1 = t
            heapq.heappush(arrivals, (t + think_time_s, client))
    assert t0 is not None
    window = t1 - t0
    ttfts, tpots, e2es = [], [], []
    for sid in finished_in_window:
        s = engine.seq(sid)
        assert s.first_token_at is not None and s.finished_at is not None
        ttfts.append(s.first_token_at - s.arrival)
        e2es.append(s.finished_at - s.arrival)
        if s.generated > 1:
            tpots.append((s.finished_at - s.first_token_at) / (s.generated - 1))
    return ClosedLoopPrediction(
        concurrency=concurrency,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tokens_per_s=tokens_in_window / window,
        requests_per_s=len(finished_in_window) / window,
        ttft_mean_s=_mean(ttfts),
        ttft_p99_s=_quantile(ttfts, 0.99),
        tpot_mean_s=_mean(tpots),
        tpot_p99_s=_quantile(tpots, 0.99),
        e2e_mean_s=_mean(e2es),
        preemptions=engine.num_preemptions - preempt_start,
        kv_usage_max=kv_max,
        window_s=window,
    )


def sweep_closed_loop(
    profile: Profile, levels: list[int], prompt_tokens: int, output_tokens: int, **kwargs: float
) -> list[ClosedLoopPrediction]:
    """``predict_closed_loop`` at each concurrency level, in order."""
    return [
        predict_closed_loop(profile, n, prompt_tokens, output_tokens, **kwargs)  # type: ignore[arg-type]
        for n in levels
    ]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile: small, dependency-free, and exact on the sample it is given."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    k = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[k]
