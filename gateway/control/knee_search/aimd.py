"""The default limit algorithm, a knee search with multiplicative decrease: find the knee of the upstream's
throughput curve and hold it there. (Named ``Aimd`` for its decrease; its increase is not additive.)

Each tick, the first rule that applies decides:

1. **Bounds**: never above ``limit_max`` or the upstream's hard cap (llama-server slots, KV capacity).
2. **Congestion** (:mod:`gateway.control.knee_search.signals`): multiplicative decrease, at most once per window
   and never while requests admitted under a higher limit still drain. Failures halve the limit and
   double back towards the last good one once the window is clean (TCP's loss recovery); headroom and
   latency breaches cut by ``decrease_factor`` (latency in proportion to the overshoot), or undo the
   step that caused them, and leave a *ceiling* that is not retried for two re-probe periods.
3. **No demand**: nothing queued and in-flight never reached the limit: hold (no idle drift).
4. **Hysteresis**: a signal over its line but not yet confirmed, or KV usage above
   ``kv_usage_resume``, blocks increases and undoes a step up not yet measured.
5. **The knee**, from throughput *read at one limit* (:mod:`gateway.control.knee_search.meter`) after it settled,
   pooled per limit on a curve (:mod:`gateway.control.knee_search.curve`). Slow start doubles while a doubling
   pays (marginal tokens/s per added slot >= ``marginal_gain_min`` x the average below); a climb in
   quarter steps does the same once a doubling was cut short. Then the limit sits at the knee
   (:mod:`gateway.control.knee_search.knee`): the smallest limit reaching ``knee_fraction`` of the best measured
   throughput, plus ``knee_margin``. Every ``reprobe_s`` of busy time one step beside it is measured
   (:mod:`gateway.control.knee_search.reprobe`: which way, and rarer at the hard cap while the answer is known), so
   the curve, and a backend that got faster or slower, are found again. Steps up never take more than
   3/4 of the KV room left, or the one sequence that fits whole (:mod:`gateway.control.knee_search.capacity`), and a
   step whose reading predicts p99 TPOT over its objective (:mod:`gateway.control.knee_search.tpot`) is undone at once.
   Readings that show the backend slower at the same limit cut it to its TPOT objective at once when the
   last p99 TPOT judged, at the new speed, would be over it; readings that show the old speed back return
   the limit, and the curve, to where they were (:mod:`gateway.control.knee_search.slowdown`).

Why throughput and not end-to-end latency: an LLM request's duration grows with its output length, so
latency-gradient algorithms (Envoy's adaptive concurrency, Netflix Gradient2) read a shift to longer
answers as congestion, or adapt their baseline to real overload and creep upward. Tokens/s at a limit,
TTFT and TPOT are per-token quantities that do not. ``docs/controller.md`` has the whole story.
"""

from __future__ import annotations

from typing import Any

from gateway.control.algorithm import Action, Decision, Phase, Reason
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.knee_search.capacity import KvRoom, over_share
from gateway.control.knee_search.ceiling import Ceiling
from gateway.control.knee_search.curve import Curve
from gateway.control.knee_search.knee import CLIMB_STEP, clearly_below, knee_target, paid, probe_step
from gateway.control.knee_search.kv_gauge import KvGauge
from gateway.control.knee_search.meter import Readings
from gateway.control.knee_search.reprobe import Probe, Reprobe
from gateway.control.knee_search.signals import CongestionDetector, Signal
from gateway.control.knee_search.slowdown import Slowdown
from gateway.control.knee_search.tpot import TpotPredictor
from gateway.control.observation import Observation
from gateway.control.share import cap_share, follow_target, leading, room_share

_DWELL_READINGS = 3  # settled readings at a limit before the curve may move it a little
_FAR = 0.2  # ... but a knee this far below (share of the limit) is acted on after one reading
_REGROUP = 0.2  # a leader's part of the replicas' demand moving this much (relative) means another fleet


class Aimd:
    """A knee search with multiplicative decrease: doubles the limit (slow start), then climbs by about a
    quarter, while each step's marginal gain pays; holds at the knee; cuts multiplicatively on congestion."""

    def __init__(self, config: AimdConfig, *, initial_limit: int, start: StartPoint | None = None) -> None:
        self.config = config
        first = start.limit if start is not None else initial_limit
        self._limit = min(max(first, config.limit_min), config.limit_max)
        self._phase = Phase.SLOW_START if start is None else Phase.CRUISE
        if start is not None and start.levels and self._limit >= max(level for level, _ in start.levels):
            self._phase = Phase.CLIMB  # the sweep never saw its curve flatten: the top is still to find
        self._peak_reference = start.peak_tokens_per_s if start is not None else None
        self._ssthresh: int | None = None
        self._probe: Probe | None = None
        self._reprobe = Reprobe(config.reprobe_s)  # when the next probe is due, and which way
        self._last_decrease_at: float | None = None
        self._ceiling = Ceiling()
        self._curve = Curve()
        if start is not None:
            self._curve.seed(start.levels)  # the sweep's curve: its knee is already bracketed
        self._detector = CongestionDetector(config)
        self._readings = Readings(config.settle_s, config.measure_s)
        self._tpot = TpotPredictor(config.min_samples)
        self._kv_room = KvRoom(config.window_s)
        self._kv_gauge = KvGauge()
        self._detail: dict[str, Any] = {}
        self._part: float | None = None  # leading other replicas: its part of their demand (see _lead)
        self._blocked_by: Reason | None = None
        self._slowdown = Slowdown()

    @property
    def limit(self) -> int:
        return self._limit

    # --- the step ---------------------------------------------------------------------------------
    def step(self, obs: Observation) -> Decision:
        now = obs.now
        self._detail = {}
        obs = self._kv_gauge.vet(obs)
        if self._kv_gauge.untrusted:
            self._detail["kv_untrusted"] = True  # a full cache that makes tokens and never preempts: missing
        if self._readings.changed_at is None:
            self._tpot.limit_set(now, self._limit)
        bottleneck = obs.queue_depth > 0 or obs.peak_inflight >= self._limit
        self._reprobe.tick(now, bottleneck)
        self._tpot.calibrate(obs, bottleneck)
        self._kv_room.observe(obs, self.config)
        signals = self._detector.update(obs)
        self._readings.observe(obs, self._limit, bottleneck)
        hi = (
            self.config.limit_max
            if obs.hard_cap is None
            else min(
                self.config.limit_max, cap_share(obs.hard_cap, _demand(obs), obs.peers, self.config.metrics_stale_s)
            )
        )
        lo = min(self.config.limit_min, hi)

        if self._limit > hi:
            self._probe = None
            capped = obs.hard_cap is not None and (hi == obs.hard_cap or hi < self.config.limit_max)  # or its share
            reason = Reason.HARD_CAP if capped else Reason.AT_MAX
            return self._change(obs, hi, reason)
        if self._limit < lo:
            return self._change(obs, lo, Reason.AT_MIN)
        if signals and obs.peak_inflight == 0 and obs.queue_depth == 0:
            # Nothing of ours ran this window: a full KV cache or a queue at the backend is somebody
            # else's load (another gateway, direct clients), and cutting an idle limit cannot relieve it.
            return self._hold(obs, Reason.NO_DEMAND)
        if signals:
            return self._congested(obs, signals, lo, bottleneck)
        followed = self._follow(obs, lo, hi, bottleneck)
        if followed is not None:
            return followed
        regrouped = self._lead(obs, lo, hi)
        if regrouped is not None:
            return regrouped
        if not bottleneck:
            if self._probe is not None and self._probe.kind == Phase.CRUISE:
                self._probe.interrupted = True
            return self._hold(obs, Reason.NO_DEMAND)
        if self._probe is not None and self._probe.interrupted:
            # Demand left before the re-probe was measured and is back now: the probe taught nothing
            # and its reading would straddle the gap, so it is abandoned and the limit returns to
            # where it was (never during the idle spell itself, so idle never moves the limit up).
            base, self._probe = self._probe.base_limit, None
            self._reprobe.abandoned(at_cap=base >= hi)
            return self._change(obs, base, Reason.PROBE)
        blocked = self._detector.blocking(obs)
        self._blocked_by = blocked
        if blocked is not None:
            self._detail["blocked_by"] = blocked.value
            if self._probe is not None and self._probe.direction > 0:
                return self._blocked(obs, blocked)
        if self._phase == Phase.SLOW_START and self._ssthresh is not None:
            return self._recover(obs, lo, hi)
        probe = self._probe
        rate = self._readings.take(
            now, short=probe is not None and probe.kind == Phase.SLOW_START and self._readings.taken == 0
        )
        if rate is None:
            return self._hold(obs, Reason.SETTLING)
        self._detail["measured_tokens_per_s"] = round(rate, 2)
        settled = self._readings.taken > 1
        if probe is not None and probe.kind == Phase.SLOW_START and not settled:
            base_rate = self._curve.rate(probe.base_limit)
            if base_rate is not None and rate < (1 - self._curve.shift) * base_rate:
                # The doubling's short reading, taken while the new prompts were prefilled, fell well under
                # what the base delivered (by more than a reading's noise). In the curve it would pool with
                # the base's reading and put the knee below everything measured, on the strength of one
                # reading that could be a prefill stall or a real fall. Neither is a reason to go below the
                # base: back to it, and on in the climb's quarter steps, each judged on a settled reading.
                self._detail["short_reading_discarded"] = True
                self._probe = None
                self._phase = Phase.CLIMB
                return self._change(obs, probe.base_limit, Reason.PROBE, Action.DECREASE)
        if obs.failures == 0 and self._curve.add(self._limit, rate, self._readings.started, settled=settled):
            # The same limit now gives a different throughput: the backend got slower or faster, or
            # the mix changed. The curve's shape, and so the knee, is kept until readings say otherwise.
            self._detail["curve_rescaled"] = True
            cut = self._cut_for_slowdown(obs, lo)
            if cut is not None:
                return cut
            # Re-measure the top soon (when cruising): the old readings only stand in for it.
            self._reprobe.rescaled(cruising=self._phase == Phase.CRUISE)
        if settled and self._slowdown.cut is not None:
            back = self._back_from_slowdown(obs, rate, hi)
            if back is not None:
                return back
        if self._probe is not None:
            if not settled and self._probe.kind != Phase.SLOW_START:
                return self._hold(obs, Reason.SETTLING, first_reading=True)
            return self._judge(obs, rate, lo, hi)
        if self._phase == Phase.SLOW_START:
            return self._slow_start(obs, lo, hi)
        if self._phase == Phase.CLIMB:
            return self._climb(obs, lo, hi)
        return self._cruise(obs, lo, hi)

    # --- congestion ------------------------------------------------------------------------------
    def _congested(self, obs: Observation, signals: list[Signal], lo: int, bottleneck: bool) -> Decision:
        signal = min(signals, key=lambda s: s.factor)
        self._detail["signals"] = [s.as_dict() for s in signals]
        now = obs.now
        # While requests admitted under a higher limit still run, the backend's state is theirs: the
        # cut already made has not taken effect yet. Failures are not load, so they are not held back.
        draining = obs.inflight > self._limit and signal.reason is not Reason.UPSTREAM_ERRORS
        recent = self._last_decrease_at is not None and now - self._last_decrease_at < self.config.window_s
        if draining or recent:
            probe = self._probe
            if probe is not None and probe.direction > 0:  # back to a known-good limit
                self._probe = None
                return self._change(obs, probe.base_limit, signal.reason, Action.DECREASE)
            return self._hold(obs, Reason.COOLDOWN, signal=signal.reason.value)
        congested_at = self._limit
        # An unused limit cut by a factor would still be unused: cut what is actually in flight.
        base = self._limit if bottleneck else min(self._limit, max(obs.peak_inflight, 1))
        new = max(lo, min(int(base * signal.factor), self._limit - 1))
        probe = self._probe
        if probe is not None and probe.direction > 0:
            new = max(lo, probe.base_limit)  # the step caused it: back to the known-good limit
        if new >= self._limit:
            return self._hold(obs, Reason.AT_MIN, signal=signal.reason.value)
        self._detector.decreased(obs, signal)
        self._last_decrease_at = now
        self._probe = None
        self._reprobe.after(self.config.window_s, direction=1)
        if signal.reason is Reason.UPSTREAM_ERRORS:
            # Failures say nothing about where the knee is: recover quickly towards the last good limit.
            recovering = self._phase == Phase.SLOW_START and self._ssthresh is not None
            self._ssthresh = max(congested_at, self._ssthresh or 0) if recovering else congested_at
            self._phase = Phase.SLOW_START
            self._ceiling.clear()
        else:
            # A doubling that hit congestion leaves the top of the curve between the two limits.
            searching = probe is not None and probe.kind == Phase.SLOW_START and self._ssthresh is None
            self._phase = Phase.CLIMB if searching else Phase.CRUISE
            self._ssthresh = None
            self._set_ceiling(now, congested_at - 1)
            self._curve.forget_above(congested_at - 1)
            if signal.reason not in (Reason.TTFT, Reason.TPOT):
                self._slowdown.cancel()  # a limit under the slowdown cut ran out of room: the old one would too
            in_use_cut = int(congested_at * signal.factor)
            if not bottleneck and new < in_use_cut:
                # The limit was not in use, so the cut went to what was in flight (a few requests while
                # the backend was full of others', or demand just starting): it says the backend was full
                # then, not where this gateway's knee is. Once the signal clears and demand is back, the
                # limit doubles back towards the cut it would have had in use, as after failures,
                # instead of climbing a slot per reading from where the moment left it.
                self._phase = Phase.SLOW_START
                self._ssthresh = in_use_cut
        return self._change(obs, new, signal.reason, Action.DECREASE)

    def _set_ceiling(self, now: float, ceiling: int) -> None:
        """After congestion: not retried for two re-probe periods (a blocked step: one, see _blocked)."""
        self._ceiling.set(now, ceiling, floor=self.config.limit_min, hold_s=2 * self.config.reprobe_s)

    # --- the knee search -------------------------------------------------------------------------
    def _top(self, obs: Observation, hi: int) -> int:
        """The highest limit an increase may go to now: bounds, the ceiling, and this replica's part of
        the KV cache's room (the followers step up with it)."""
        if self._blocked_by is not None:
            return self._limit  # inside a signal's hysteresis band: no increase at all
        ceiling = self._ceiling.at(obs.now)
        top = hi if ceiling is None else max(min(hi, ceiling), self.config.limit_min)
        room = self._room(obs)
        if room is not None:
            top = min(top, max(self._limit + room, self._limit))
        return top

    def _begin(self, obs: Observation, target: int, kind: Phase, reason: Reason) -> Decision:
        self._probe = Probe(1 if target > self._limit else -1, self._limit, kind)
        return self._change(obs, target, reason)

    def _slow_start(self, obs: Observation, lo: int, hi: int) -> Decision:
        top = self._top(obs, hi)
        if self._ssthresh is not None:
            top = min(top, self._ssthresh)
        target = min(self._limit * 2, top)
        if target <= self._limit:
            self._phase = Phase.CRUISE
            self._ssthresh = None
            return self._cruise(obs, lo, hi)
        return self._begin(obs, target, Phase.SLOW_START, Reason.SLOW_START)

    def _recover(self, obs: Observation, lo: int, hi: int) -> Decision:
        """After failures: double back towards the last good limit every settle period while the
        window stays free of failures. The curve from before still holds, so nothing needs measuring;
        the only question is whether the failures are over, and they show within seconds."""
        changed_at = self._readings.changed_at
        assert changed_at is not None
        self._probe = None
        if obs.failures or obs.now - changed_at < self.config.settle_s:
            return self._hold(obs, Reason.SETTLING, recovering_to=self._ssthresh)
        return self._slow_start(obs, lo, hi)

    def _climb(self, obs: Observation, lo: int, hi: int) -> Decision:
        if not self._curve.settled(self._limit):
            return self._hold(obs, Reason.SETTLING)  # the climb's base needs a settled reading
        step = max(1, round(CLIMB_STEP * self._limit))
        target = min(self._limit + step, self._top(obs, hi))
        if target <= self._limit:
            self._phase = Phase.CRUISE
            return self._cruise(obs, lo, hi)
        return self._begin(obs, target, Phase.CLIMB, Reason.PROBE)

    def _cruise(self, obs: Observation, lo: int, hi: int, *, probed: bool = False) -> Decision:
        """Sit at the knee of the measured curve; every ``reprobe_s`` measure one step beside it.
        ``probed``: a probe just got its reading, and the knee is read off the curve right away (it
        went there only to measure)."""
        self._phase = Phase.CRUISE
        at_cap = self._limit >= hi  # nothing above: every probe is a down-probe (see reprobe.py)
        if at_cap:
            self._reprobe.reclimb = False  # the top to measure again is this limit, and it was just read
        known = self._curve.weight(self._limit)
        top = self._top(obs, hi)
        target = knee_target(self._curve, self.config, self._limit, lo, top)
        # A knee far below is plain from a first reading (slow start ran past it); anything else could
        # be the noise of one reading, so it waits until this limit's point pools a few.
        # Only a bracketed knee counts: the quarter step down that explores an unbracketed curve is one
        # slot at a limit of four, "far" by ratio, and must not be taken on a first, unsettled reading.
        found = self._curve.knee(self.config.knee_fraction)
        bracketed = found is not None and found[1]
        far_below = bracketed and target is not None and target < (1 - _FAR) * self._limit
        # After a rescale the curve's top is a guess (only this limit is measured anew), so a knee read
        # off it only ever lies below this limit: acting on it is how the limit crept down after a
        # backend recovered. The top is measured again first (the climb-sized probe, due at once).
        if self._reprobe.reclimb and known >= 1:
            target = None
        elif not far_below and not probed and (known < 1 or (target is not None and known < _DWELL_READINGS)):
            return self._hold(obs, Reason.SETTLING, knee=target)
        if target is not None and target != self._limit:
            self._detail["curve"] = self._curve.as_dict()
            if not bracketed and target < self._limit:
                # Nothing measured below yet: the step down is a question, so it is a probe, judged
                # (and undone if it lost throughput) as soon as its reading settles. After an attempt
                # lost its demand, the next one waits for the re-probe schedule.
                if self._reprobe.waiting and not self._reprobe.due(at_cap=at_cap):
                    return self._hold(obs, Reason.STEADY, next_probe_in_s=self._reprobe.in_s())
                self._reprobe.begin()
                return self._begin(obs, target, Phase.CRUISE, Reason.PROBE)
            return self._change(obs, target, Reason.KNEE)
        if not self._reprobe.due(at_cap=at_cap):
            return self._hold(obs, Reason.STEADY, next_probe_in_s=self._reprobe.in_s())
        yielded = self._yield(obs, lo, room_to_grow=top > self._limit and not self._kv_room.full(obs, self.config))
        if yielded is not None:
            return yielded
        self._reprobe.begin()
        step = probe_step(self.config, self._limit)
        # Down-probes measure where the knee itself is estimated to be (the limit sits a margin above
        # it), since the estimate between two far-apart readings is the least certain part. An
        # estimate that rests on a first reading below it (slow start's, a probe's) is a guess, not a
        # bracket: a probe there can cost half the throughput for as long as it lasts, so the probe
        # takes one step and lets the curve's settled readings walk the knee down.
        down = self._limit - step
        if found is not None and self._curve.measured_around(found[0]):
            down = min(down, found[0])
        up, down = min(self._limit + step, top), max(down, lo)
        climb = min(max(self._limit + step, self._limit + round(CLIMB_STEP * self._limit)), top)
        turn = self._reprobe.choose(self._limit, up, down, climb)
        if turn is None:  # up is closed (the hard cap, a ceiling): this turn is skipped
            return self._hold(obs, Reason.AT_MAX if self._limit >= hi else Reason.CEILING)  # see _hold
        target, climbing = turn
        return self._begin(obs, target, Phase.CLIMB if climbing else Phase.CRUISE, Reason.PROBE)

    def _yield(self, obs: Observation, lo: int, *, room_to_grow: bool) -> Decision | None:
        """Give a probe step back to the others on a full backend that runs clearly more of ours than of
        everyone else's (``capacity.over_share``). Not where the other replicas' numbers are known: there
        the leader's search sizes them all, and demand splits it (``_follow``)."""
        if obs.peers is not None and obs.peers.age_s <= self.config.metrics_stale_s:
            return None
        step = probe_step(self.config, self._limit)
        if not over_share(obs, self.config, room_to_grow=room_to_grow) or self._limit - step < lo:
            return None
        self._reprobe.after(self.config.reprobe_s)
        return self._change(obs, self._limit - step, Reason.FAIR_SHARE)

    def _room(self, obs: Observation) -> int | None:
        """This replica's part of the KV cache's room for more requests (all of it alone), None if unknown."""
        room = self._kv_room.room(obs, self.config)
        return None if room is None else room_share(room, _demand(obs), obs.peers, self.config.metrics_stale_s)

    def _lead(self, obs: Observation, lo: int, hi: int) -> Decision | None:
        """As the leader (``share.leading``): when its part of the replicas' demand moves by more than
        ``_REGROUP`` (a replica joined or left), keep the fleet's limit by scaling its own, and its
        curve with it (``Curve.regroup``). Becoming the leader starts its curve afresh: it was measured
        at an unknown part, or alone."""
        part = leading(self._limit, _demand(obs), obs.peers, self.config.metrics_stale_s)
        if part is None:
            if obs.peers is None or obs.peers.leader is not None:
                self._part = None  # alone, or following: a leader's part is taken afresh
            return None
        if self._part is None:
            self._part = part
            self._curve.clear()
            self._slowdown.cancel()
            return None
        if abs(part - self._part) <= _REGROUP * self._part:
            return None
        factor = part / self._part
        target = min(max(round(self._limit * factor), lo), hi)
        self._part = part
        self._curve.regroup(factor)
        self._slowdown.cancel()  # its curve counts limits of the old part
        self._probe = None
        self._detail["regrouped"] = round(part, 3)
        return self._change(obs, target, Reason.FOLLOW) if target != self._limit else None

    def _follow(self, obs: Observation, lo: int, hi: int, bottleneck: bool) -> Decision | None:
        """As a follower (``share.follow_target``), move with the leading replica every tick, and search
        no knee of its own: None where this replica leads or is alone. Up only while its limit is the
        bottleneck (idle never moves a limit up) and into its part of the KV room."""
        target = follow_target(self._limit, _demand(obs), obs.peers, self.config.metrics_stale_s)
        if target is None:
            return None
        self._probe = None
        self._phase = Phase.CRUISE
        self._ssthresh = None
        target = min(max(target, lo), hi)
        self._detail["follow"] = target
        if target > self._limit:
            room = self._room(obs)
            if not bottleneck:
                target = self._limit
            elif room is not None:
                target = min(target, self._limit + max(room, 0))
        if target == self._limit:
            return self._hold(obs, Reason.FOLLOW)
        return self._change(obs, target, Reason.FOLLOW)

    def _judge(self, obs: Observation, rate: float, lo: int, hi: int) -> Decision:
        """A step was measured (the curve already holds the reading): keep going, or settle."""
        probe = self._probe
        assert probe is not None
        self._probe = None
        now = obs.now
        predicted = self._tpot.predict(self._limit, rate)
        slo = self.config.tpot_p99_slo_s
        base_rate = self._curve.rate(probe.base_limit)
        if predicted is not None:
            self._detail["predicted_tpot_p99"] = round(predicted, 4)
        if probe.direction > 0 and predicted is not None and slo is not None and predicted > slo:
            # Back to the largest limit predicted within the objective, throughput read on the line between
            # the base and the step.
            fit = (
                probe.base_limit
                if base_rate is None
                else self._tpot.largest_within(slo, probe.base_limit, base_rate, self._limit, rate)
            )
            self._set_ceiling(now, self._limit - 1)
            self._curve.forget_above(fit)
            self._phase = Phase.CRUISE
            self._ssthresh = None
            return self._change(obs, fit, Reason.TPOT, Action.DECREASE)
        if probe.kind == Phase.CRUISE or probe.direction < 0:
            if probe.direction < 0 and probe.base_limit >= hi:  # the question at the hard cap, answered
                self._reprobe.answered(known=clearly_below(self._curve, self.config, self._limit, probe.base_limit))
            return self._cruise(obs, lo, hi, probed=True)
        paid_off, judged_on = paid(self._curve, self.config, probe.base_limit, self._limit, rate)
        self._detail.update(judged_on)
        if probe.kind == Phase.SLOW_START:
            if paid_off:
                return self._slow_start(obs, lo, hi)
            # A doubling that did not pay was judged on one short reading taken right after the step, while
            # the new requests were still in their prefills. Where it brackets the knee, the knee is read
            # at once; where it reads under the base, so that the knee may lie below everything measured,
            # that short reading is the only evidence for stepping below the base, and settled readings
            # at this limit come first.
            found = self._curve.knee(self.config.knee_fraction)
            return self._cruise(obs, lo, hi, probed=found is not None and found[1])
        return self._climb(obs, lo, hi) if paid_off else self._cruise(obs, lo, hi, probed=True)

    def _cut_for_slowdown(self, obs: Observation, lo: int) -> Decision | None:
        """The curve just rescaled down: where the running answers will be over the TPOT objective at the new
        speed, the limit goes at once to where they meet it (``Slowdown.cut_to``), with a ceiling as after a
        latency cut."""
        found = self._slowdown.cut_to(self._limit, lo, self._curve, self._tpot, self.config.tpot_p99_slo_s)
        if found is None:
            return None
        target, predicted = found
        self._detail["predicted_tpot_p99"] = round(predicted, 4)
        self._probe = None
        self._set_ceiling(obs.now, self._limit - 1)
        self._curve.forget_above(target)
        self._phase = Phase.CRUISE
        self._ssthresh = None
        return self._change(obs, target, Reason.TPOT, Action.DECREASE)

    def _back_from_slowdown(self, obs: Observation, rate: float, hi: int) -> Decision | None:
        """After a slowdown cut, a settled reading that is what the backend gave at this limit before it got
        slower: the limit returns to where it was before the cut, under the curve measured then, and the cut's
        ceiling goes (re-probes alone would take minutes to climb back)."""
        cut = self._slowdown.recovered(self._limit, rate)
        if cut is None:
            return None
        self._curve = cut.rescale.before
        self._ceiling.clear()
        target = min(cut.limit_before, hi)
        if target <= self._limit:
            return None
        self._probe = None
        self._phase = Phase.CRUISE
        self._detail["recovered_from"] = self._limit
        return self._change(obs, target, Reason.RECOVERED, Action.INCREASE)

    def _blocked(self, obs: Observation, reason: Reason) -> Decision:
        """A step up ran into a headroom signal before it could be measured: undo it, and do not
        retry that limit for a re-probe period. A slow-start doubling that was cut short means the top
        of the curve lies between the two limits, so the search climbs there in smaller steps."""
        probe = self._probe
        assert probe is not None
        self._probe = None
        blocked_at = self._limit
        self._ceiling.set(obs.now, blocked_at - 1, floor=self.config.limit_min, hold_s=self.config.reprobe_s)
        if probe.kind == Phase.SLOW_START and self._ssthresh is None:
            self._phase = Phase.CLIMB
        else:
            self._phase = Phase.CRUISE
            self._ssthresh = None
        return self._change(obs, probe.base_limit, reason, Action.DECREASE)

    # --- bookkeeping -----------------------------------------------------------------------------
    def _change(self, obs: Observation, limit: int, reason: Reason, action: Action | None = None) -> Decision:
        previous = self._limit
        if action is None:
            action = Action.INCREASE if limit > previous else Action.DECREASE if limit < previous else Action.HOLD
        if limit > previous:
            self._detector.increased(obs.now)
        if limit != previous:
            self._limit = limit
            self._readings.limit_changed(obs.now)
            self._tpot.limit_set(obs.now, limit)
        return self._decision(obs, previous, action, reason)

    def _hold(self, obs: Observation, reason: Reason, **detail: Any) -> Decision:
        if self._blocked_by is not None and reason in (Reason.STEADY, Reason.CEILING, Reason.AT_MAX):
            reason = Reason.HEADROOM_NEAR  # what holds it there is the signal in its band
        self._detail.update(detail)
        return self._decision(obs, self._limit, Action.HOLD, reason)

    def _decision(self, obs: Observation, previous: int, action: Action, reason: Reason) -> Decision:
        inputs = obs.as_dict()
        inputs.update(self._detail)
        return Decision(obs.now, self._limit, previous, action, reason, self._phase, inputs)

    def state(self) -> dict[str, Any]:
        probe = self._probe
        return {
            "algorithm": "aimd",
            "limit": self._limit,
            "phase": self._phase.value,
            "ssthresh": self._ssthresh,
            "ceiling": self._ceiling.value,
            "ceiling_until": self._ceiling.until if self._ceiling.value is not None else None,
            "probe": None
            if probe is None
            else {
                "direction": "up" if probe.direction > 0 else "down",
                "base_limit": probe.base_limit,
                "kind": probe.kind,
            },
            "curve": self._curve.as_dict(),
            "slowdown_cut": self._slowdown.state(),  # where the limit returns once readings show the old speed
            **self._reprobe.state(),
            "last_decrease_at": self._last_decrease_at,
            "steady_since": self._readings.steady_since,
            "tpot_p99_scale": None if self._tpot.scale is None else round(self._tpot.scale, 4),
            "peak_reference_tokens_per_s": self._peak_reference,
            "exact_throughput": self._readings.meter.exact,
            "tokens_source": self._readings.meter.source,
            "reading_pending": self._readings.pending is not None,
            "signals": self._detector.state(),
        }


def _demand(obs: Observation) -> int:
    """This replica's demand on the backend, as the replicas publish it to each other: in flight plus queued."""
    return obs.inflight + obs.queue_depth
