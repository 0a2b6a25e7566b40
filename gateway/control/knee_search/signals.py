"""Congestion signals: which thresholds an observation crosses, once they have *persisted*.

A static threshold on a single scrape is how the Gateway API Inference Extension oscillates: one
noisy reading over the line sheds load, the next under it adds it back. Here a threshold counts only
after ``breach_ticks`` consecutive ticks over it (the backend queue after ``backend_queue_persist_s``),
a reading older than ``metrics_stale_s`` is ignored rather than trusted (never fail closed on a scrape
that stopped), and a signal that is over its line but not yet confirmed only *blocks increases*: that
band is the hysteresis. Failures (5xx, upstream timeouts) and a rising preemption counter are facts,
not noisy levels, so they count at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.control.algorithm import Reason
from gateway.control.config import AimdConfig
from gateway.control.observation import Observation

# A latency decrease is sized by how far over its objective p99 is, but never halves the limit at
# once: one window's p99 may still hold requests admitted at a higher limit.
_LATENCY_FACTOR_FLOOR = 0.5
_KV_FACTOR_FLOOR = 0.5
# The NVML floor decreases again only when free memory has fallen further since the last decrease by
# this much: preallocating servers (vLLM, llama-server) do not give memory back when we lower the
# limit, so "still under the floor" alone would ratchet the limit down to its minimum.
_GPU_FURTHER_DROP = 0.01
# The backend's waiting gauge is read per engine step, and a request that arrives mid-step waits for
# the next one: a busy vLLM (and the simulator) often reports a request or two waiting with the KV cache
# half empty (docs/controller.md, "What it does, in order", has the figures). That is a request in transit,
# not a queue; a queue the backend cannot admit (KV full, max_num_seqs reached) is steady and grows with
# the excess.
# So waiting counts only beyond what arrives during one step: more than this share of the running
# batch, and more than one request.
QUEUE_SHARE = 0.1
# After a latency cut, increases wait until the objective is judged again on requests admitted since, or
# this long at most: traffic that turned to whole answers (no latency samples) must not block them for ever.
UNJUDGED_MAX_S = 120.0


@dataclass(frozen=True, slots=True)
class Signal:
    """A confirmed congestion signal: what, the measured value and its line, and the decrease factor."""

    reason: Reason
    value: float
    threshold: float
    factor: float

    def as_dict(self) -> dict[str, object]:
        return {
            "reason": self.reason.value,
            "value": round(self.value, 4),
            "threshold": self.threshold,
            "factor": round(self.factor, 3),
        }


class CongestionDetector:
    """Per-upstream signal state: persistence streaks, the last preemption count, and so on."""

    def __init__(self, config: AimdConfig) -> None:
        self.config = config
        self._streak: dict[Reason, int] = {}
        self._preemptions: float | None = None
        self._waiting_since: float | None = None
        self._gpu_free_at_decrease: float | None = None
        self._pending: list[Reason] = []  # over their line, not yet confirmed
        self._unjudged: tuple[Reason, float] | None = None  # a latency objective's cut, when; not judged since

    # --- freshness -------------------------------------------------------------------------------
    def _fresh(self, age: float | None) -> bool:
        return age is not None and age <= self.config.metrics_stale_s

    def _persist(self, reason: Reason, over: bool) -> bool:
        """Count consecutive ticks over the line; True once the streak reaches ``breach_ticks``."""
        if not over:
            self._streak.pop(reason, None)
            return False
        self._streak[reason] = self._streak.get(reason, 0) + 1
        if self._streak[reason] >= self.config.breach_ticks:
            return True
        self._pending.append(reason)
        return False

    # --- the signals -----------------------------------------------------------------------------
    def update(self, obs: Observation) -> list[Signal]:
        """Evaluate every signal for this tick (call exactly once per tick); confirmed ones returned."""
        cfg = self.config
        self._pending = []
        found: list[Signal] = []
        if self._unjudged is not None and (
            _judged_on(obs, self._unjudged[0]) >= cfg.min_samples or obs.now - self._unjudged[1] >= UNJUDGED_MAX_S
        ):
            self._unjudged = None

        if obs.completed > 0 and obs.failures > 0:
            rate = obs.failures / obs.completed
            if rate >= cfg.error_rate_max:
                found.append(Signal(Reason.UPSTREAM_ERRORS, rate, cfg.error_rate_max, cfg.error_decrease_factor))

        if self._fresh(obs.preemptions_age_s) and obs.preemptions_total is not None:
            last, self._preemptions = self._preemptions, obs.preemptions_total
            if last is not None and obs.preemptions_total > last:
                found.append(Signal(Reason.PREEMPTIONS, obs.preemptions_total - last, 0.0, cfg.decrease_factor))

        kv_fresh = self._fresh(obs.kv_usage_age_s) and obs.kv_usage is not None
        kv = obs.kv_usage if kv_fresh and obs.kv_usage is not None else 0.0
        if self._persist(Reason.KV_USAGE, kv_fresh and kv >= cfg.kv_usage_high):
            # KV usage is proportional to the sequences running: cut to where it would be back at
            # kv_usage_resume, not by a fixed fifth (near a KV-bound backend's best, that is a lot).
            factor = max(_KV_FACTOR_FLOOR, cfg.kv_usage_resume / kv)
            found.append(Signal(Reason.KV_USAGE, kv, cfg.kv_usage_high, factor))

        found.extend(self._gpu(obs))
        found.extend(self._backend_queue(obs))

        for reason, value, slo in (
            (Reason.TTFT, obs.ttft_p99, cfg.ttft_p99_slo_s),
            (Reason.TPOT, obs.tpot_p99, cfg.tpot_p99_slo_s),
        ):
            measured = slo is not None and value is not None and _judged_on(obs, reason) >= cfg.min_samples
            over = measured and value > slo  # type: ignore[operator]
            if self._persist(reason, over):
                assert value is not None and slo is not None
                factor = min(cfg.decrease_factor, max(_LATENCY_FACTOR_FLOOR, slo / value))
                found.append(Signal(reason, value, slo, factor))
        return found

    def _gpu(self, obs: Observation) -> list[Signal]:
        cfg = self.config
        free = obs.gpu_memory_free_min
        fresh = self._fresh(obs.gpus_age_s) and free is not None
        if fresh and free is not None and free >= cfg.gpu_free_memory_floor:
            self._gpu_free_at_decrease = None  # recovered: the next breach is new
        if not self._persist(Reason.GPU_MEMORY, fresh and free is not None and free < cfg.gpu_free_memory_floor):
            return []
        assert free is not None
        last = self._gpu_free_at_decrease
        if last is not None and free > last - _GPU_FURTHER_DROP:
            self._pending.append(Reason.GPU_MEMORY)  # not ours to reclaim: block increases only
            return []
        return [Signal(Reason.GPU_MEMORY, free, cfg.gpu_free_memory_floor, cfg.decrease_factor)]

    def _backend_queue(self, obs: Observation) -> list[Signal]:
        cfg = self.config
        waiting = obs.backend_waiting
        if obs.peak_inflight == 0 and obs.queue_depth == 0:
            # Nothing of this gateway's ran or waited since the last tick: whatever waits in the backend was sent
            # by someone else (its own clients, another gateway), and a lower limit here would not shorten it,
            # only hold this gateway back once its load returns. Its clock starts when this gateway sends again.
            self._waiting_since = None
            return []
        if not (
            self._fresh(obs.backend_waiting_age_s)
            and waiting is not None
            and waiting > queue_allowance(obs.backend_running)
        ):
            self._waiting_since = None
            return []
        if self._waiting_since is None:
            self._waiting_since = obs.now
        queued_for = obs.now - self._waiting_since
        if queued_for < cfg.backend_queue_persist_s:
            if queued_for >= cfg.backend_queue_persist_s / 2:  # one scrape after an admission burst is normal
                self._pending.append(Reason.BACKEND_QUEUE)
            return []
        return [Signal(Reason.BACKEND_QUEUE, float(waiting), 0.0, cfg.decrease_factor)]

    # --- hysteresis ------------------------------------------------------------------------------
    def blocking(self, obs: Observation) -> Reason | None:
        """A signal inside its band (over its line but unconfirmed, or KV between resume and high):
        no increase now, but no decrease either."""
        if self._pending:
            return self._pending[0]
        if self._unjudged is not None:
            # After a latency cut the objective is judged again only on requests admitted since: until
            # enough have finished, a step up would go back over the line before anything could say so.
            return self._unjudged[0]
        kv_fresh = self._fresh(obs.kv_usage_age_s) and obs.kv_usage is not None
        if kv_fresh and obs.kv_usage is not None and obs.kv_usage >= self.config.kv_usage_resume:
            return Reason.KV_USAGE
        return None

    def increased(self, now: float) -> None:
        """The limit just rose: the admitted burst waits in the backend for a step or two, which is
        not the persistent queue this signal is about; time it from when the burst is absorbed."""
        if self._waiting_since is not None:
            self._waiting_since = now

    def decreased(self, obs: Observation, signal: Signal) -> None:
        """The controller acted on ``signal``: remember what the next decrease must improve on."""
        if signal.reason is Reason.GPU_MEMORY:
            self._gpu_free_at_decrease = signal.value
        if signal.reason in (Reason.TTFT, Reason.TPOT):
            self._unjudged = (signal.reason, obs.now)
        if signal.reason is Reason.BACKEND_QUEUE:
            self._waiting_since = obs.now  # the backend gets a full persistence period to drain

    def state(self) -> dict[str, object]:
        return {
            "streaks": {reason.value: count for reason, count in self._streak.items()},
            "pending": [reason.value for reason in self._pending],
            "preemptions_seen": self._preemptions,
            "backend_waiting_since": self._waiting_since,
            "latency_unjudged": None if self._unjudged is None else self._unjudged[0].value,
        }


def _judged_on(obs: Observation, reason: Reason) -> int:
    """How many requests the latency objective ``reason`` is judged on."""
    return obs.ttft_samples if reason is Reason.TTFT else obs.latency_samples


def queue_allowance(running: int | None) -> float:
    """How many waiting requests are requests in transit to the next engine step, not a queue."""
    return max(1.0, QUEUE_SHARE * (running or 0))
