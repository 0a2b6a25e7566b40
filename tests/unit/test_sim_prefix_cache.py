"""The simulator's prefix caching: hits skip prefill, blocks are shared and evicted LRU under KV pressure."""

from __future__ import annotations

from gateway.sim import text
from gateway.sim.engine import Engine
from gateway.sim.profiles import get_profile

PROFILE = get_profile("llama3.1-8b-24gb")
BS = PROFILE.block_size


def _hashes(n_tokens: int, salt: str = "") -> tuple[int, tuple[int, ...]]:
    ids = text.text_token_ids(salt + text.text_of_tokens(n_tokens))[:n_tokens]
    return len(ids), text.block_hashes(ids, BS)


def _run(engine: Engine, now: float) -> float:
    t = now
    while (at := engine.next_step_at(t)) is not None:
        res = engine.step(at)
        assert res is not None
        t = res.end
    return t


def _ttft(engine: Engine, sid: int) -> float:
    seq = engine.seq(sid)
    assert seq.first_token_at is not None
    return seq.first_token_at - seq.arrival


def test_block_hashes_are_chained_and_cover_full_blocks_only() -> None:
    ids = list(range(3 * BS + 5))
    hashes = text.block_hashes(ids, BS)
    assert len(hashes) == 3
    assert text.block_hashes(ids[: 2 * BS], BS) == hashes[:2]
    changed = [99999, *ids[1:]]  # the first token differs: every later block's key differs too
    assert not set(text.block_hashes(changed, BS)) & set(hashes)


def test_chat_token_ids_count_like_the_token_rule_and_share_a_prefix() -> None:
    history = [{"role": "system", "content": "you are terse " * 30}, {"role": "user", "content": "hello " * 50}]
    longer = [*history, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert len(text.chat_token_ids(history)) == text.chat_prompt_tokens(history)[0]
    a, b = text.chat_token_ids(history), text.chat_token_ids(longer)
    assert b[: len(a) - 3] == a[:-3]  # all but the reply's template tokens
    renamed = [{"role": "user", "content": history[0]["content"]}, *history[1:]]
    assert text.chat_token_ids(renamed)[:4] != a[:4]  # the role is part of the prompt


def test_a_repeated_prompt_hits_the_cache_and_skips_prefill() -> None:
    engine = Engine(PROFILE)
    n, hashes = _hashes(2000)
    first = engine.submit(n, 4, 0.0, ignore_eos=True, block_hashes=hashes)
    t = _run(engine, 0.0)
    second = engine.submit(n, 4, t + 1.0, ignore_eos=True, block_hashes=hashes)
    _run(engine, t + 1.0)
    hit_tokens = (n - 1) // BS * BS
    assert engine.seq(second).cached_tokens == hit_tokens
    assert engine.prefix_queries_total == 2 * n and engine.prefix_hits_total == hit_tokens
    assert _ttft(engine, second) < _ttft(engine, first) / 3  # 2000 tokens of prefill became at most 16
    assert engine.used_blocks == 0  # nothing held once both finished; the blocks stay cached as free space
    assert engine.cache.free_blocks == len(hashes)


def test_without_hashes_or_with_caching_off_nothing_hits() -> None:
    n, hashes = _hashes(1000)
    plain = Engine(PROFILE)
    plain.submit(n, 2, 0.0, ignore_eos=True)
    plain.submit(n, 2, _run(plain, 0.0), ignore_eos=True)
    _run(plain, 10.0)
    off = Engine(PROFILE, prefix_caching=False)
    off.submit(n, 2, 0.0, ignore_eos=True, block_hashes=hashes)
    off.submit(n, 2, _run(off, 0.0), ignore_eos=True, block_hashes=hashes)
    _run(off, 10.0)
    for engine in (plain, off):
        assert engine.prefix_hits_total == 0 and len(engine.cache) == 0


def test_concurrent_sequences_share_cached_blocks() -> None:
    engine = Engine(PROFILE)
    n, hashes = _hashes(1600)
    engine.submit(n, 200, 0.0, ignore_eos=True, block_hashes=hashes)
    t = _run_until_first_token(engine)
    before = engine.used_blocks
    other = engine.submit(n + 50, 200, t, ignore_eos=True, block_hashes=_hashes(n + 50)[1])
    engine.step(t)
    engine.step(engine.busy_until)
    assert engine.seq(other).cached_tokens == len(hashes) * BS
    # the second holds only what it added: its tail and the tokens decoded, not another copy of the prefix
    assert engine.used_blocks - before < 10


def _run_until_first_token(engine: Engine) -> float:
    t = 0.0
    while True:
        res = engine.step(t)
        assert res is not None
        t = res.end
        if res.first_tokens:
            return t


def test_cached_blocks_are_evicted_least_recently_freed_first_under_kv_pressure() -> None:
    engine = Engine(PROFILE)
    engine.set_scenario(kv_fraction=0.2)  # a pool of a few hundred blocks
    total = engine.total_blocks
    assert 100 < total < 1000
    size = total // 3 * BS - BS  # three prompts fit side by side, a fourth evicts the oldest
    prompts = [_hashes(size, salt=f"p{i}") for i in range(4)]
    t = 0.0
    for n, hashes in prompts:
        engine.submit(n, 1, t, ignore_eos=True, block_hashes=hashes)
        t = _run(engine, t) + 1.0
    assert engine.cache.evictions > 0
    assert engine.used_blocks == 0 and engine.cache.free_blocks <= total
    n0, h0 = prompts[0]
    n2, h2 = prompts[2]
    again_oldest = engine.submit(n0, 1, t, ignore_eos=True, block_hashes=h0)
    t = _run(engine, t) + 1.0
    again_recent = engine.submit(n2, 1, t, ignore_eos=True, block_hashes=h2)
    _run(engine, t)
    # the oldest prompt lost its blocks to the fourth, tail first (a few leading ones may remain)
    assert engine.seq(again_oldest).cached_tokens < size // 10
    assert engine.seq(again_recent).cached_tokens == (n2 - 1) // BS * BS


def test_preempted_and_aborted_sequences_leave_the_block_counts_consistent() -> None:
    engine = Engine(PROFILE)
    shared = text.text_of_tokens(1500)
    t = 0.0
    sids = []
    for i in range(60):  # far past the pool: preemption by recompute, with shared prefixes
        ids = text.text_token_ids(shared + f" user {i} " + str(i) * 4000)
        sids.append(engine.submit(len(ids), 300, t, ignore_eos=True, block_hashes=text.block_hashes(ids, BS)))
    for _ in range(400):
        res = engine.step(t)
        if res is None:
            break
        t = res.end
    assert engine.num_preemptions > 0
    for sid in sids[::2]:
        engine.abort(sid, t)
    _run(engine, t)
    assert engine.used_blocks == 0
    assert engine.cache.free_blocks <= engine.total_blocks
    assert engine.prefix_hits_total > 0
