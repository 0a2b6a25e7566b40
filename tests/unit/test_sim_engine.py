"""The pure engine: scheduling, KV accounting, preemption, aborts, knobs. Virtual time only."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from gateway.sim.engine import (
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    Engine,
    InjectedError,
    StepResult,
)
from gateway.sim.profiles import LLAMA31_8B_24GB, QWEN36_35B_A3B_32GB, Profile


def run_to_idle(engine: Engine, now: float = 0.0, max_steps: int = 1_000_000) -> list[StepResult]:
    out = []
    for _ in range(max_steps):
        at = engine.next_step_at(now)
        if at is None:
            return out
        res = engine.step(at)
        assert res is not None, "engine had work but made no step"
        out.append(res)
        now = res.end
    raise AssertionError("engine did not drain")


def small_pool(profile: Profile, blocks: int) -> Profile:
    """The same profile with a KV pool of about ``blocks`` blocks (via the overhead field)."""
    target = blocks * profile.block_bytes / 2**30
    usable = profile.gpu_memory_gib * profile.gpu_memory_utilization - profile.weights_gib
    # a hair more than the target so float rounding cannot lose the last block
    return dataclasses.replace(profile, overhead_gib=usable - target - 1e-9, max_model_len=blocks * profile.block_size)


def test_one_request_follows_the_step_time_model() -> None:
    p = LLAMA31_8B_24GB
    e = Engine(p)
    sid = e.submit(100, 4, now=1.0)
    steps = run_to_idle(e, now=1.0)
    assert len(steps) == 4  # one prefill step (which samples token 1) + three decode steps
    expected = 1.0 + p.step_time(0, prefill_tokens=100, kv_tokens=100)
    assert steps[0].end == pytest.approx(expected)
    for i, st in enumerate(steps[1:], start=1):
        expected += p.step_time(1, 0, kv_tokens=100 + i)
        assert st.end == pytest.approx(expected)
    s = e.seq(sid)
    assert (s.generated, s.finish_reason, s.first_token_at) == (4, FINISH_LENGTH, pytest.approx(steps[0].end))
    assert s.finished_at == pytest.approx(expected)
    assert e.prompt_tokens_total == 100 and e.generation_tokens_total == 4
    assert e.used_blocks == 0 and e.kv_usage == 0.0


def test_long_prompts_are_prefilled_in_chunks_under_the_token_budget() -> None:
    p = dataclasses.replace(LLAMA31_8B_24GB, max_num_batched_tokens=512)
    e = Engine(p)
    sid = e.submit(1300, 2, now=0.0)
    steps = run_to_idle(e)
    assert [st.prefill_tokens for st in steps[:3]] == [512, 512, 276]
    assert e.seq(sid).first_token_at == steps[2].end  # no token before the whole prompt is in
    assert [st.tokens for st in steps] == [[], [], [sid], [sid]]


def test_running_sequences_are_capped_by_max_num_seqs() -> None:
    e = Engine(LLAMA31_8B_24GB)
    e.set_scenario(max_num_seqs=3)
    ids = [e.submit(10, 20, now=0.0) for _ in range(7)]
    peak, now = 0, 0.0
    while (at := e.next_step_at(now)) is not None:
        st = e.step(at)
        assert st is not None
        now = st.end
        peak = max(peak, e.num_running)
    assert peak == 3
    assert all(e.seq(i).generated == 20 for i in ids)


def test_past_kv_capacity_the_engine_preempts_by_recompute_and_still_finishes_everything() -> None:
    p = small_pool(LLAMA31_8B_24GB, blocks=40)  # 640 tokens of KV
    e = Engine(p)
    ids = [e.submit(16, 200, now=0.0) for _ in range(6)]  # admitted small, each grows to 14 blocks
    preempted: set[int] = set()
    for st in run_to_idle(e):
        preempted.update(st.preempted)
        assert e.used_blocks <= e.total_blocks
    assert e.num_preemptions > 0 and preempted
    for sid in ids:
        s = e.seq(sid)
        assert (s.generated, s.finish_reason) == (200, FINISH_LENGTH)  # delivered tokens are never lost
    assert sum(e.seq(i).preemptions for i in ids) == e.num_preemptions
    assert e.prompt_tokens_total == 6 * 16  # recompute is not counted as new prompt tokens
    assert e.generation_tokens_total == 6 * 200
    assert e.used_blocks == 0


def test_a_preempted_sequence_recomputes_prompt_and_output() -> None:
    p = small_pool(LLAMA31_8B_24GB, blocks=20)
    e = Engine(p)
    a = e.submit(16, 250, now=0.0)
    b = e.submit(16, 250, now=0.0)
    victim_step = None
    steps = []
    now = 0.0
    while (at := e.next_step_at(now)) is not None:
        st = e.step(at)
        assert st is not None
        steps.append(st)
        now = st.end
        if st.preempted and victim_step is None:
            victim_step = st
            victim = e.seq(st.preempted[0])
            assert victim.id == b  # the most recently admitted goes first
            assert victim.computed == 0 and victim.blocks == 0 and victim.state == "waiting"
            done_before = victim.generated
            break
    assert victim_step is not None
    nxt = [e.step(now)]
    while b not in nxt[-1].tokens:
        at = e.next_step_at(nxt[-1].end)
        assert at is not None
        res = e.step(at)
        assert res is not None
        nxt.append(res)
    # the step that gives b its next token had to prefill its prompt and all tokens it had produced
    recompute = sum(st.prefill_tokens for st in nxt)
    assert recompute >= 16 + done_before
    assert e.seq(a).state in ("running", "finished")


def test_abort_frees_the_kv_cache_at_once() -> None:
    e = Engine(QWEN36_35B_A3B_32GB)
    a = e.submit(500, 100, now=0.0)
    b = e.submit(500, 100, now=0.0)
    e.step(0.0)
    assert e.num_running == 2 and e.used_blocks > 0
    held = e.seq(a).blocks
    used = e.used_blocks
    assert e.abort(a, now=0.1)
    assert e.used_blocks == used - held and e.num_running == 1
    assert e.seq(a).finish_reason == FINISH_ABORT and e.seq(a).finished_at == 0.1
    assert not e.abort(a, now=0.2)  # already finished
    assert e.abort(b, now=0.2)
    assert e.used_blocks == 0 and e.kv_usage == 0.0 and not e.has_work
    c = e.submit(10, 10, now=0.3)  # aborting a waiting sequence works too
    assert e.abort(c, now=0.3) and e.num_waiting == 0


def test_same_seed_same_run_and_different_seed_different_lengths() -> None:
    def run(seed: int) -> tuple[list[int], list[tuple[float, list[int]]]]:
        e = Engine(QWEN36_35B_A3B_32GB, seed=seed, eos_mean_tokens=40)
        ids = [e.submit(64, 200, now=0.0) for _ in range(20)]
        steps = run_to_idle(e)
        return [e.seq(i).generated for i in ids], [(s.end, s.tokens) for s in steps]

    lengths, steps = run(7)
    assert run(7) == (lengths, steps)
    assert run(8)[0] != lengths
    assert max(lengths) < 200 and min(lengths) >= 1


def test_eos_stops_early_unless_ignored() -> None:
    e = Engine(QWEN36_35B_A3B_32GB, seed=3, eos_mean_tokens=10)
    free = [e.submit(8, 300, now=0.0) for _ in range(30)]
    forced = [e.submit(8, 300, now=0.0, ignore_eos=True) for _ in range(3)]
    run_to_idle(e)
    assert {e.seq(i).finish_reason for i in free} == {FINISH_STOP}
    assert sum(e.seq(i).generated for i in free) / len(free) < 30
    assert all((e.seq(i).generated, e.seq(i).finish_reason) == (300, FINISH_LENGTH) for i in forced)


def test_requests_that_do_not_fit_the_context_are_refused() -> None:
    e = Engine(QWEN36_35B_A3B_32GB)
    with pytest.raises(ValueError, match="max_model_len"):
        e.submit(4000, 200, now=0.0)
    with pytest.raises(ValueError):
        e.submit(0, 10, now=0.0)


def test_error_rate_knob_fails_submissions() -> None:
    e = Engine(QWEN36_35B_A3B_32GB, seed=1)
    e.set_scenario(error_rate=1.0)
    with pytest.raises(InjectedError):
        e.submit(10, 10, now=0.0)
    e.set_scenario(error_rate=0.5)
    failures = 0
    for _ in range(200):
        try:
            e.submit(10, 10, now=0.0)
        except InjectedError:
            failures += 1
    assert 60 < failures < 140
    e.reset_scenario()
    e.submit(10, 10, now=0.0)


def test_speed_factor_stretches_every_step() -> None:
    base, slow = Engine(QWEN36_35B_A3B_32GB), Engine(QWEN36_35B_A3B_32GB)
    slow.set_scenario(speed_factor=2.0)
    for e in (base, slow):
        e.submit(300, 50, now=0.0)
    fast_end = run_to_idle(base)[-1].end
    slow_end = run_to_idle(slow)[-1].end
    assert slow_end == pytest.approx(2 * fast_end)


def test_stall_holds_steps_until_it_ends() -> None:
    e = Engine(QWEN36_35B_A3B_32GB)
    e.submit(10, 3, now=0.0)
    e.set_scenario(stalled_until=5.0)
    assert e.step(1.0) is None
    assert e.next_step_at(1.0) == 5.0
    st = e.step(5.0)
    assert st is not None and st.start == 5.0


def test_shrinking_the_kv_pool_preempts_down_to_the_new_size() -> None:
    e = Engine(LLAMA31_8B_24GB)
    for _ in range(30):
        e.submit(1000, 500, now=0.0)
    now = 0.0
    while e.seq(29).first_token_at is None:
        st = e.step(now)
        assert st is not None
        now = st.end
    assert e.num_running == 30
    e.set_scenario(kv_fraction=0.25)
    st = e.step(now)
    assert st is not None and st.preempted
    assert e.used_blocks <= e.total_blocks == int(LLAMA31_8B_24GB.num_gpu_blocks * 0.25)
    assert e.num_running < 30


def test_a_sequence_that_can_never_fit_fails_instead_of_hanging() -> None:
    e = Engine(QWEN36_35B_A3B_32GB)
    e.set_scenario(kv_fraction=0.01)  # 129 blocks < the 197 blocks of recurrent state alone
    sid = e.submit(10, 10, now=0.0)
    st = e.step(0.0)
    assert st is not None and st.finished == [sid]
    assert e.seq(sid).finish_reason == FINISH_ERROR and not e.has_work


def test_a_lone_sequence_outgrowing_a_shrunken_pool_fails_instead_of_thrashing() -> None:
    e = Engine(LLAMA31_8B_24GB)
    sid = e.submit(100, 3000, now=0.0)  # grows to 194 blocks
    e.set_scenario(kv_fraction=0.05)  # 123 blocks
    steps = run_to_idle(e)
    s = e.seq(sid)
    assert s.finish_reason == FINISH_ERROR and 0 < s.generated < 3000
    assert steps[-1].finished == [sid] and e.used_blocks == 0 and e.num_preemptions == 0


def test_advance_runs_steps_back_to_back_until_a_time() -> None:
    e = Engine(QWEN36_35B_A3B_32GB)
    e.submit(100, 1000, now=0.0)
    steps = e.advance(until=1.0, now=0.0)
    assert steps and steps[-1].start < 1.0
    assert all(a.end == b.start for a, b in itertools.pairwise(steps))
    assert e.advance(until=0.5) == []  # nothing starts before 0.5 any more
    assert e.busy_until >= 1.0 - steps[-1].duration


def test_forget_drops_only_finished_records() -> None:
    e = Engine(QWEN36_35B_A3B_32GB)
    a = e.submit(10, 2, now=0.0)
    e.forget(a)
    assert e.seq(a).state == "waiting"
    run_to_idle(e)
    e.forget(a)
    with pytest.raises(KeyError):
        e.seq(a)
