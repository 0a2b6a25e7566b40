"""The pure engine: a continuous-batching inference server on an injected clock.

No I/O, no asyncio, no sleeping: every method takes the current (virtual) time as an argument,
so the same object drives the HTTP simulator in real time and the controller's scenario tests on
virtual time (hours of traffic in seconds of CPU).

The scheduler follows vLLM V1 closely, because the cliff we want to reproduce comes from its
rules, not from a formula:

* each step every running sequence contributes its pending tokens under one token budget
  (``max_num_batched_tokens``): one token for a decoding sequence, a chunk of the prompt for a
  prefilling one (chunked prefill);
* a step that completes a sequence's pending tokens samples one new token for it; all tokens of a
  step appear at the step's end;
* KV blocks are allocated for the tokens a step computes; when none are free the engine preempts
  the most recently admitted running sequence by *recompute*: its blocks are freed, it goes back
  to the front of the waiting queue, and when it runs again it must prefill its prompt *and* the
  tokens it already produced (those tokens were delivered and stay delivered);
* waiting sequences are admitted first-come-first-served while there is budget, a free slot under
  ``max_num_seqs`` and room for their blocks, and only in steps without preemption;
* prefix caching (vLLM's automatic prefix caching, on by default): a request submitted with the chained
  hashes of its prompt's full blocks starts from the longest run of leading blocks already cached, so
  prefill skips them; filled prompt blocks are shared between sequences, stay cached after their last user
  finishes and are evicted, least recently freed first, when an allocation needs their room
  (:mod:`gateway.sim.prefix_cache`). A request without hashes neither hits nor fills the cache.
* multi-LoRA (vLLM's ``--enable-lora``, :mod:`gateway.sim.lora`): a batch holds the requests of at most
  ``max_loras`` distinct adapters; a waiting request for another adapter is skipped (it keeps its place at the
  front of the queue) while the requests behind it may go, as vLLM's scheduler does; an adapter that is not
  resident when scheduled is loaded, and the load lengthens that step.

Stepping is cheap on purpose: a sequence is one small slotted object, a step is one pass over the
running list, and nothing is allocated per token.
"""

from __future__ import annotations

import math
import random
from collections import deque

from gateway.sim.lora import AdapterCache, LoraConfig
from gateway.sim.prefix_cache import PrefixCache
from gateway.sim.profiles import Profile
from gateway.sim.records import (
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISHED,
    RUNNING,
    WAITING,
    Sequence,
    StepResult,
)
from gateway.sim.scenario import InjectedError, Scenario

__all__ = [  # the records and knobs moved to their own modules; importers of this one keep working
    "FINISHED",
    "FINISH_ABORT",
    "FINISH_ERROR",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "RUNNING",
    "WAITING",
    "Engine",
    "InjectedError",
    "Scenario",
    "Sequence",
    "StepResult",
]


class Engine:
    """A continuous-batching server. Call :meth:`submit`, then :meth:`step` back to back.

    ``eos_mean_tokens`` (optional) makes requests that do not set ``ignore_eos`` stop early at a
    geometrically distributed length with that mean, as sampling an end-of-sequence token would.
    All randomness comes from ``seed``, so a run is reproducible from its inputs.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        seed: int = 0,
        eos_mean_tokens: float | None = None,
        prefix_caching: bool = True,
        lora: LoraConfig | None = None,
    ) -> None:
        profile.validate()
        self.profile = profile
        self.eos_mean_tokens = eos_mean_tokens
        self._rng = random.Random(seed)
        self._seqs: dict[int, Sequence] = {}
        self._next_id = 0
        self._running: list[Sequence] = []
        self._waiting: deque[Sequence] = deque()
        self._state_blocks = profile.state_blocks_per_seq
        self._block_size = profile.block_size
        self.total_blocks = profile.num_gpu_blocks
        self.used_blocks = 0
        self.prefix_caching = prefix_caching
        self.cache = PrefixCache()
        self.adapters = AdapterCache(lora) if lora is not None else None  # None: LoRA not enabled
        self.scenario = Scenario()
        self.busy_until = float("-inf")  # end of the last step
        # counters, monotonic like vLLM's Prometheus counters
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.steps_total = 0
        self.prefix_queries_total = 0  # prompt tokens looked up in the prefix cache (vLLM's counter)
        self.prefix_hits_total = 0  # of those, tokens found cached

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        now: float,
        *,
        ignore_eos: bool = False,
        block_hashes: tuple[int, ...] = (),
        lora: str | None = None,
    ) -> int:
        """Queue a request; returns its sequence id. Raises :class:`InjectedError` per the error rate.

        ``block_hashes`` are the chained hashes of the prompt's full blocks
        (:func:`gateway.sim.text.block_hashes`): what makes the request's prefix findable in the cache.
        ``lora`` names the adapter it runs with (one the server serves), None the base model."""
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if lora is not None and (self.adapters is None or not self.adapters.serves(lora)):
            raise ValueError(f"LoRA adapter {lora!r} is not served")
        if prompt_tokens + max_tokens > self.profile.max_model_len:
            raise ValueError(
                f"prompt ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"{self.profile.max_model_len}"
            )
        if self.scenario.error_rate > 0.0 and self._rng.random() < self.scenario.error_rate:
            raise InjectedError("injected failure (scenario error_rate)")
        target = max_tokens
        if not ignore_eos and self.eos_mean_tokens:
            # geometric length: every token is EOS with probability 1/mean
            u = self._rng.random()
            p = 1.0 / self.eos_mean_tokens
            draw = 1 + int(_log1m(u) / _log1m(p)) if p < 1.0 else 1
            target = min(max_tokens, draw)
        sid = self._next_id
        self._next_id += 1
        hashes = block_hashes[: prompt_tokens // self._block_size] if self.prefix_caching else ()
        seq = Sequence(sid, prompt_tokens, max_tokens, target, now, hashes, lora)
        self._seqs[sid] = seq
        self._waiting.append(seq)
        return sid

    def abort(self, sid: int, now: float) -> bool:
        """Stop a sequence and free its KV at once. Returns False if it had already finished."""
        seq = self._seqs.get(sid)
        if seq is None or seq.state == FINISHED:
            return False
        if seq.state == RUNNING:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._finish(seq, FINISH_ABORT, now)
        return True

    def seq(self, sid: int) -> Sequence:
        return self._seqs[sid]

    def forget(self, sid: int) -> None:
        """Drop a finished sequence's record (long runs call this to keep memory flat)."""
        seq = self._seqs.get(sid)
        if seq is not None and seq.state == FINISHED:
            del self._seqs[sid]

    # ------------------------------------------------------------------ state
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return min(1.0, self.used_blocks / self.total_blocks) if self.total_blocks else 1.0

    @property
    def max_num_seqs(self) -> int:
        return self.scenario.max_num_seqs or self.profile.max_num_seqs

    def running_adapters(self) -> list[str]:
        """Distinct adapters of the running requests, in batch order (vLLM's ``running_lora_adapters``)."""
        return list(dict.fromkeys(s.lora for s in self._running if s.lora is not None))

    def waiting_adapters(self) -> list[str]:
        """Distinct adapters of the waiting requests, in queue order (vLLM's ``waiting_lora_adapters``)."""
        return list(dict.fromkeys(s.lora for s in self._waiting if s.lora is not None))

    def running_ids(self) -> list[int]:
        return [s.id for s in self._running]

    def waiting_ids(self) -> list[int]:
        return [s.id for s in self._waiting]

    def next_step_at(self, now: float) -> float | None:
        """When the next step can start, or None when there is nothing to do."""
        if not self.has_work:
            return None
        return max(now, self.busy_until, self.scenario.stalled_until)

    # ------------------------------------------------------------------ scenario knobs
    def set_scenario(
        self,
        *,
        speed_factor: float | None = None,
        kv_fraction: float | None = None,
        max_num_seqs: int | None = None,
        error_rate: float | None = None,
        error_status: int | None = None,
        stalled_until: float | None = None,
    ) -> Scenario:
        """Change the backend at run time; any knob left None keeps its value."""
        sc = self.scenario
        if speed_factor is not None:
            if speed_factor <= 0:
                raise ValueError("speed_factor must be > 0")
            sc.speed_factor = float(speed_factor)
        if kv_fraction is not None:
            if not 0.0 < kv_fraction <= 1.0:
                raise ValueError("kv_fraction must be in (0, 1]")
            sc.kv_fraction = float(kv_fraction)
            self.total_blocks = max(1, int(self.profile.num_gpu_blocks * kv_fraction))
        if max_num_seqs is not None:
            if max_num_seqs < 0:
                raise ValueError("max_num_seqs must be >= 0 (0 = the profile's)")
            sc.max_num_seqs = int(max_num_seqs) or None
        if error_rate is not None:
            if not 0.0 <= error_rate <= 1.0:
                raise ValueError("error_rate must be in [0, 1]")
            sc.error_rate = float(error_rate)
        if error_status is not None:
            if not 500 <= error_status <= 599:
                raise ValueError("error_status must be a 5xx status")
            sc.error_status = int(error_status)
        if stalled_until is not None:
            sc.stalled_until = float(stalled_until)
        return sc

    def reset_scenario(self) -> Scenario:
        self.scenario = Scenario()
        self.total_blocks = self.profile.num_gpu_blocks
        return self.scenario

    # ------------------------------------------------------------------ stepping
    def step(self, now: float) -> StepResult | None:
        """Run one step starting at ``max(now, busy_until)``; None if idle or stalled at ``now``.

        The caller owns time: in real time it sleeps until ``result.end`` before delivering the
        tokens; on virtual time it simply calls ``step(result.end)`` next.
        """
        start = now if now > self.busy_until else self.busy_until
        if start < self.scenario.stalled_until or not (self._running or self._waiting):
            return None
        res = StepResult(start, start)
        budget = self.profile.max_num_batched_tokens
        bs = self._block_size
        running = self._running
        scheduled: list[tuple[Sequence, int]] = []
        decode = prefill = kv = 0

        self._shrink_to_capacity(res)
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = seq.prompt_len + seq.generated - seq.computed
            if n > budget:
                n = budget
            need = self._state_blocks + -(-(seq.computed + n) // bs) - seq.blocks - len(seq.cached)
            while need > self.total_blocks - self.used_blocks:
                victim = running.pop()
                if victim is seq and not running:
                    # alone and still short of blocks: it can never finish in this pool (only
                    # possible after kv_fraction shrank it); fail it rather than thrash forever
                    self._finish(seq, FINISH_ERROR, start)
                    res.finished.append(seq.id)
                    break
                self._preempt(victim, res)
                if victim is seq:
                    break
            else:
                self.used_blocks += need
                seq.blocks += need
                budget -= n
                scheduled.append((seq, n))
                kv += seq.computed + n
                if n == 1 and seq.generated:
                    decode += 1
                else:
                    prefill += n
                i += 1
                continue
            # the sequence preempted itself; everything after it is gone too

        if not res.preempted:
            limit = self.max_num_seqs
            waiting = self._waiting
            adapters = self.adapters
            max_loras = adapters.max_loras if adapters is not None else 0
            loras = {s.lora for s in running if s.lora is not None} if adapters is not None else set()
            skipped: list[Sequence] = []  # waiting for an adapter slot: they keep their place at the front
            while waiting and budget > 0 and len(running) < limit:
                seq = waiting[0]
                if seq.lora is not None and seq.lora not in loras and len(loras) >= max_loras:
                    skipped.append(waiting.popleft())
                    continue
                total = seq.prompt_len + seq.generated
                hit = revived = 0
                if seq.hashes:  # vLLM computes at least one token: a fully cached prompt redoes its last
                    hit, revived = self.cache.match(seq.hashes, (total - 1) // bs)
                n = total - hit * bs
                if n > budget:
                    n = budget
                own = self._state_blocks + -(-(hit * bs + n) // bs) - hit
                need = own + revived
                if need > self.total_blocks - self.used_blocks:
                    if not running and need > self.total_blocks:
                        waiting.popleft()  # can never fit: fail it rather than hang
                        self._finish(seq, FINISH_ERROR, start)
                        res.finished.append(seq.id)
                        continue
                    break
                waiting.popleft()
                seq.state = RUNNING
                if seq.scheduled_at is None:
                    seq.scheduled_at = start
                for h in seq.hashes[:hit]:
                    self.used_blocks += self.cache.acquire(h)
                seq.cached = list(seq.hashes[:hit])
                seq.computed = seq.cached_tokens = hit * bs
                if seq.hashes:
                    self.prefix_queries_total += total
                    self.prefix_hits_total += hit * bs
                self.used_blocks += own
                seq.blocks = own
                running.append(seq)
                if seq.lora is not None:
                    loras.add(seq.lora)
                budget -= n
                scheduled.append((seq, n))
                kv += seq.computed + n
                prefill += n
            if skipped:
                waiting.extendleft(reversed(skipped))

        if self.cache.free_blocks:
            self.cache.evict(self.total_blocks - self.used_blocks)
        if not scheduled:
            return None if not res.finished and not res.preempted else res

        duration = self.profile.step_time(decode, prefill, kv) * self.scenario.speed_factor
        if self.adapters is not None:
            res.lora_load_s = self.adapters.activate(s.lora for s, _ in scheduled if s.lora is not None)
            duration += res.lora_load_s
        end = start + duration
        res.end = end
        res.decode_seqs, res.prefill_tokens, res.kv_tokens = decode, prefill, kv
        self.busy_until = end
        self.steps_total += 1
        tokens = res.tokens
        done: list[Sequence] = []
        for seq, n in scheduled:
            seq.computed += n
            if seq.hashes and len(seq.cached) < len(seq.hashes):
                self._register_full_blocks(seq)
            if seq.computed == seq.prompt_len + seq.generated:
                seq.generated += 1
                seq.last_token_at = end
                tokens.append(seq.id)
                if seq.first_token_at is None:
                    seq.first_token_at = end
                    res.first_tokens.append(seq.id)
                    self.prompt_tokens_total += seq.prompt_len
                if seq.generated >= seq.target_len:
                    done.append(seq)
        self.generation_tokens_total += len(tokens)
        for seq in done:
            running.remove(seq)
            reason = FINISH_LENGTH if seq.generated >= seq.max_tokens else FINISH_STOP
            self._finish(seq, reason, end)
            res.finished.append(seq.id)
        return res

    def advance(self, until: float, now: float | None = None) -> list[StepResult]:
        """Run steps back to back while one can start before ``until``; returns them in order."""
        out: list[StepResult] = []
        t = self.busy_until if now is None else now
        while True:
            at = self.next_step_at(t)
            if at is None or at >= until:
                return out
            res = self.step(at)
            if res is None:
                return out
            out.append(res)
            t = res.end

    # ------------------------------------------------------------------ internals
    def _register_full_blocks(self, seq: Sequence) -> None:
        """Hand the prompt blocks the sequence has just filled to the prefix cache, in order."""
        full = min(seq.computed // self._block_size, len(seq.hashes))
        cached = seq.cached
        for j in range(len(cached), full):
            h = seq.hashes[j]
            self.used_blocks += self.cache.register(h)
            seq.blocks -= 1
            cached.append(h)

    def _free_blocks(self, seq: Sequence) -> None:
        """Free a sequence's own blocks and drop its references to cached ones (they stay cached)."""
        self.used_blocks -= seq.blocks + self.cache.release(seq.cached)
        seq.blocks = 0
        seq.cached = []

    def _preempt(self, seq: Sequence, res: StepResult) -> None:
        self._free_blocks(seq)
        seq.computed = 0
        seq.state = WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(seq)
        res.preempted.append(seq.id)

    def _shrink_to_capacity(self, res: StepResult) -> None:
        """After the KV pool shrank (a scenario knob), preempt from the tail until it fits."""
        while self.used_blocks > self.total_blocks and self._running:
            self._preempt(self._running.pop(), res)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        self._free_blocks(seq)
        seq.state = FINISHED
        seq.finish_reason = reason
        seq.finished_at = now


def _log1m(x: float) -> float:
    return math.log1p(-x)
