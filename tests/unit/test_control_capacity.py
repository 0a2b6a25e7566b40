"""The KV cache's room for more sequences, as the knee search reads it before stepping up."""

from __future__ import annotations

from dataclasses import replace

from gateway.control.capacity import KvRoom
from gateway.control.config import AimdConfig
from gateway.control.observation import LimiterState, Observation, observe
from gateway.control.window import SlidingWindow

CONFIG = AimdConfig()  # kv_usage_resume 0.9


def scrape(now: float, kv: float | None, running: int, age_s: float = 1.0) -> Observation:
    obs = observe(now, SlidingWindow(10.0).stats(now), LimiterState(running, running, running, 0))
    return replace(obs, kv_usage=kv, kv_usage_age_s=age_s, backend_running=running)


def test_the_room_counts_sequences_at_the_kv_each_holds_on_average_over_the_span() -> None:
    """Ten sequences whose KV swings with their lives (a wave of prompts, then whole contexts): 0.072 to
    0.084 of the cache each. The last scrape alone (0.84) leaves no room; the mean (0.078) leaves one."""
    room = KvRoom(span_s=10.0)
    for tick in range(10):
        room.observe(scrape(float(tick), 0.72 if tick % 2 == 0 else 0.84, 10), CONFIG)
    assert room.room(scrape(9.0, 0.84, 10), CONFIG) == 1
    single = KvRoom(span_s=10.0)
    single.observe(scrape(9.0, 0.84, 10), CONFIG)
    assert single.room(scrape(9.0, 0.84, 10), CONFIG) == 0


def test_old_scrapes_leave_the_span_and_the_room_follows_longer_contexts() -> None:
    room = KvRoom(span_s=10.0)
    for tick in range(10):
        room.observe(scrape(float(tick), 0.5, 10), CONFIG)  # 0.05 each: room for 0.75 x 8 = 6 more
    assert room.room(scrape(9.0, 0.5, 10), CONFIG) == 6
    for tick in range(20, 30):
        room.observe(scrape(float(tick), 0.8, 10), CONFIG)  # longer prompts now: 0.08 each
    assert room.room(scrape(29.0, 0.8, 10), CONFIG) == 0


def test_unknown_or_stale_kv_usage_gives_no_room_figure() -> None:
    room = KvRoom(span_s=10.0)
    room.observe(scrape(0.0, 0.5, 10), CONFIG)
    assert room.room(scrape(1.0, None, 10), CONFIG) is None
    assert room.room(scrape(1.0, 0.5, 10, age_s=CONFIG.metrics_stale_s + 1), CONFIG) is None
    assert room.room(scrape(1.0, 0.5, 0), CONFIG) is None
    assert KvRoom(span_s=10.0).room(scrape(1.0, 0.5, 10), CONFIG) is None  # nothing observed yet
