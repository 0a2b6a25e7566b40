"""A real sweep of a real ``sweetspot sim`` process, checked against the simulator's pure model.

The default profile is calibrated so that 90% of the peak is reached between 16 and 32 concurrent
streams; the sweep must find its sweet spot there, and the tokens/s it measures at each level must
agree with ``predict_closed_loop`` (the engine run on virtual time) within 15%. The simulator runs at
``--time-scale 2`` to keep the test short; measured throughput is divided by it to compare (and
latencies are compressed by it, which only makes the default SLOs easier to hold).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.common.processes import LISTENING, RunningProcess, start_process, sweetspot
from gateway.sim.oracle import predict_closed_loop
from gateway.sim.profiles import DEFAULT_PROFILE, get_profile
from gateway.sweep.driver import SweepConfig, SweepEvent, run_sweep
from gateway.sweep.result import SLO
from gateway.sweep.workload import Workload, parse_length

TIME_SCALE = 2.0
LEVELS = (8, 16, 24, 32)
OUTPUT_TOKENS = 64


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningProcess]:
    # The oracle's engine gets no prompt hashes, so it models no prefix cache: the server under test neither.
    with start_process(
        sweetspot("sim", "--port", "0", "--time-scale", str(TIME_SCALE), "--no-prefix-caching"),
        ready_pattern=LISTENING,
        timeout=60,
    ) as proc:
        yield proc


@pytest.mark.timeout(240)
async def test_sweep_finds_the_calibrated_sweet_spot_and_matches_the_model(sim: RunningProcess) -> None:
    events: list[SweepEvent] = []
    config = SweepConfig(
        url=sim.url,
        levels=LEVELS,
        requests_per_level=64,
        workload=Workload(prompt_len=parse_length(128), output_len=parse_length(OUTPUT_TOKENS), seed=3),
        slo=SLO(),
        level_timeout_s=120,
        request_timeout_s=60,
    )
    result = await run_sweep(config, progress=events.append)

    assert [lv.concurrency for lv in result.levels] == list(LEVELS), result.verdict
    assert all(lv.failed == 0 and lv.rejected == 0 for lv in result.levels), [lv.error_samples for lv in result.levels]
    assert result.token_counting == "usage"
    assert result.server.model == get_profile(DEFAULT_PROFILE).model  # discovered from /v1/models
    assert result.sweet_spot is not None, result.verdict
    assert 16 <= result.sweet_spot.concurrency <= 32, result.verdict
    assert result.cliff is None, result.cliff

    profile = get_profile(DEFAULT_PROFILE)
    report = []
    for level in result.levels:
        prompt_tokens = round(level.input_tokens / level.completed)  # what the simulator counted
        predicted = predict_closed_loop(profile, level.concurrency, prompt_tokens, OUTPUT_TOKENS)
        measured = level.output_tokens_per_s / TIME_SCALE
        report.append((level.concurrency, round(measured), round(predicted.tokens_per_s)))
        assert measured == pytest.approx(predicted.tokens_per_s, rel=0.15), (
            f"concurrency {level.concurrency}: measured {measured:.0f} tok/s (sim time), model says "
            f"{predicted.tokens_per_s:.0f}; all levels (concurrency, measured, predicted): {report}\n"
            f"{sim.output()[-2000:]}"
        )

    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("level_end") == len(LEVELS)
    assert {e.phase for e in events if e.kind == "progress"} >= {"warmup", "measure"}
