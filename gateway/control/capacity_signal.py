"""The capacity signal: how many backends a model's demand needs, from what one backend delivers at its limit.

Each control tick the server hands :meth:`CapacitySignal.step` one :class:`Reading` per upstream (the model it
serves, whether its limit bound, its window's goodput and output tokens/s, its backlog) and gets one
:class:`ModelSignal` per model back. The arithmetic (docs/deploy.md, "The capacity signal"):

* **Capacity of one backend**: its window's successful requests/s and output tokens/s, taken only from a
  *steady* tick: its limit has bound at every tick for at least ``settle_s`` (the window's span), and over that
  time it owed no completions (:class:`_Steadiness`): requests admitted faster than completions made room for
  them (a backend that joins a queued pool and is filled at once, a burst into an idle one) start together and
  end together a request's length later, so until as many have ended, a window holds a fraction of what the
  backend delivers. The window then covers only time spent at the limit in steady state, so the reading is
  what the backend delivers there, not what the clients happened to ask for. A load that rises gradually owes
  nothing and is measured ``settle_s`` after its limit binds. The last steady reading is kept while the upstream
  is known (a backend's capacity does not fall because its load did). The pool's capacity is the **median** over
  the backends measured so far: one slow or fast outlier does not move it, and a backend not measured yet takes
  the median's value.
* **Demand**: arrivals per second, what waits included. Between an earlier tick within the window and now, every
  arrival has either finished or is still in flight or queued, so ``arrivals = completions + (backlog now -
  backlog then)``, over the time between, the backlog being in flight plus queued. A queue that grows counts as
  demand the backends did not meet.
* **Wanted**: ``ceil(demand / (target_utilisation x pool capacity))``, at least 1 (a model that is served needs
  a backend; going to zero is the autoscaler's ``minReplicas``, not a measurement). When every backend of the
  model is saturated and requests wait, at least one more than there are (the demand the gateway sees is then
  capped by what it admits and queues: it cannot read how much more there is, only that there is more).
* **Desired** (the exported figure) follows *wanted* with a hysteresis: up at once; down only once the lower
  figure has held for ``scale_down_after_s``, and then to the highest figure wanted during that hold, so a
  dip shorter than the hold never removes a backend and a step down never goes below what the demand of the
  whole hold needed.

No measurement yet (no backend of the model has had a steady window): no capacity and no desired figure, absent
rather than a guess; the demand is still known. Pure: times are plain floats from the caller's clock, nothing
here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median

#: A ratio's rounding noise: 2.0000000001 backends is 2.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Reading:
    """One upstream at one control tick."""

    upstream: str
    model: str  # the model it serves (the metrics' ``model`` label)
    saturated: bool  # its limit bound over the tick: the peak in flight reached it, or requests waited for it
    goodput_requests_per_s: float  # successful requests/s over its window
    output_tokens_per_s: float  # output tokens/s over its window
    finished: tuple[float, ...]  # when each request in its window ended (any outcome), on the caller's clock
    backlog: int  # in flight now
    window_s: float  # the span its window covers


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one backend delivered over a window spent at its limit in steady state."""

    requests_per_s: float
    tokens_per_s: float
    at: float  # when it was measured


@dataclass(slots=True)
class _Steadiness:
    """Whether one upstream's window is a steady reading of its limit.

    ``owed``: completions still owed by a jump in the backlog. Requests admitted faster than completions make
    room for them (a fresh backend filled at once, a burst into an idle one) started together and end together,
    a request's length later; until as many have ended, a window holds fewer completions than the backend
    delivers. Each tick adds the backlog's growth since the last and takes off the completions since; a backlog
    that grows by less than what completes (a load that rises gradually, a steady one) owes nothing.
    ``steady_since``: the first tick of the current run of ticks with the limit binding and nothing owed."""

    backlog: int = 0  # in flight at the last tick (0 before the first: a new upstream starts empty)
    counted_to: float | None = None  # completions up to this tick are counted
    owed: int = 0
    steady_since: float | None = None

    def observe(self, now: float, reading: Reading) -> None:
        # what finished before the first tick the upstream is seen at is not counted: its start is not known
        ended = 0 if self.counted_to is None else sum(1 for at in reading.finished if self.counted_to < at <= now)
        self.owed = max(0, self.owed + max(0, reading.backlog - self.backlog) - ended)
        self.backlog, self.counted_to = reading.backlog, now
        if not reading.saturated or self.owed > 0:
            self.steady_since = None
        elif self.steady_since is None:
            self.steady_since = now


@dataclass(frozen=True, slots=True)
class ModelSignal:
    """One model's figures at one tick. None: not known (exported as an absent series)."""

    model: str
    upstreams: int  # backends serving it now
    capacities: dict[str, Capacity]  # those measured, by upstream
    pool_requests_per_s: float | None  # the median of the measured backends' capacity
    pool_tokens_per_s: float | None
    demand_requests_per_s: float | None  # None until the demand has a span to be measured over
    wanted: int | None  # the figure before the hysteresis
    desired: int | None  # the exported figure
    all_saturated: bool  # every backend of the model at its limit with requests waiting


def wanted_backends(demand: float, capacity: float, target_utilisation: float) -> int:
    """``ceil(demand / (target_utilisation x capacity))``, at least 1. ``capacity`` must be positive."""
    if capacity <= 0 or not 0 < target_utilisation <= 1:
        raise ValueError("capacity must be positive and target_utilisation within (0, 1]")
    need = max(demand, 0.0) / (target_utilisation * capacity)
    return max(1, math.ceil(need - _EPSILON))


@dataclass
class Hysteresis:
    """Up at once; down after the lower figure held for ``hold_s``, to the highest figure wanted meanwhile."""

    hold_s: float
    current: int | None = None
    _lower_since: float | None = None
    _lower_max: int = 0

    def step(self, now: float, wanted: int) -> int:
        if self.current is None or wanted >= self.current:
            self.current = wanted
            self._lower_since = None
            return self.current
        if self._lower_since is None:
            self._lower_since, self._lower_max = now, wanted
        else:
            self._lower_max = max(self._lower_max, wanted)
        if now - self._lower_since >= self.hold_s:
            self.current = self._lower_max
            # still lower than the new figure: a new hold starts now
            self._lower_since, self._lower_max = (now, wanted) if wanted < self.current else (None, 0)
        return self.current


@dataclass
class _Demand:
    """A model's backlog (in flight plus queued) over the last window, to count arrivals from."""

    backlog: deque[tuple[float, int]] = field(default_factory=deque)

    def rate(self, now: float, backlog: int, finished: list[float], window_s: float) -> float | None:
        """Arrivals/s since the oldest tick still inside the window (whose completions the window still holds)."""
        self.backlog.append((now, backlog))
        while self.backlog[0][0] < now - window_s:
            self.backlog.popleft()
        then, before = self.backlog[0]
        if now - then <= 0:
            return None  # one reading in the window: no span to see anything arrive over
        completed = sum(1 for at in finished if then < at <= now)
        return max(0.0, (completed + backlog - before) / (now - then))


class CapacitySignal:
    """Per model: each backend's capacity at its limit, the pool's median, the demand and the backends desired."""

    def __init__(self, target_utilisation: float, scale_down_after_s: float, settle_s: float) -> None:
        if not 0 < target_utilisation <= 1:
            raise ValueError("target_utilisation must be within (0, 1]")
        if scale_down_after_s < 0 or settle_s < 0:
            raise ValueError("scale_down_after_s and settle_s must not be negative")
        self.target_utilisation = target_utilisation
        self.scale_down_after_s = scale_down_after_s
        self.settle_s = settle_s
        self._steadiness: dict[str, _Steadiness] = {}
        self._capacity: dict[str, Capacity] = {}
        self._demand: dict[str, _Demand] = {}
        self._hysteresis: dict[str, Hysteresis] = {}

    def capacity(self, upstream: str) -> Capacity | None:
        return self._capacity.get(upstream)

    def step(self, now: float, readings: list[Reading], queued: dict[str, int] | None = None) -> list[ModelSignal]:
        """One tick: ``readings`` of every upstream known now, ``queued`` requests waiting per model. An upstream
        or model missing from the readings is forgotten (its capacity, its hysteresis)."""
        queued = queued or {}
        known = {reading.upstream for reading in readings}
        for gone in set(self._capacity) - known:
            del self._capacity[gone]
        for gone in set(self._steadiness) - known:
            del self._steadiness[gone]
        for reading in readings:
            self._observe(now, reading)
        by_model: dict[str, list[Reading]] = {}
        for reading in readings:
            by_model.setdefault(reading.model, []).append(reading)
        for gone in set(self._demand) - set(by_model):
            del self._demand[gone]
        for gone in set(self._hysteresis) - set(by_model):
            del self._hysteresis[gone]
        return [self._model(now, model, group, queued.get(model, 0)) for model, group in sorted(by_model.items())]

    def _observe(self, now: float, reading: Reading) -> None:
        steadiness = self._steadiness.setdefault(reading.upstream, _Steadiness())
        steadiness.observe(now, reading)
        steady = steadiness.steady_since
        if steady is not None and now - steady >= self.settle_s and reading.goodput_requests_per_s > 0:
            self._capacity[reading.upstream] = Capacity(
                reading.goodput_requests_per_s, reading.output_tokens_per_s, now
            )

    def _model(self, now: float, model: str, group: list[Reading], queued: int) -> ModelSignal:
        capacities = {r.upstream: self._capacity[r.upstream] for r in group if r.upstream in self._capacity}
        backlog = sum(r.backlog for r in group) + queued
        window_s = max(r.window_s for r in group)
        demand = self._demand.setdefault(model, _Demand()).rate(
            now, backlog, [at for r in group for at in r.finished], window_s
        )
        all_saturated = queued > 0 and all(r.saturated for r in group)
        pool_requests = median(c.requests_per_s for c in capacities.values()) if capacities else None
        pool_tokens = median(c.tokens_per_s for c in capacities.values()) if capacities else None
        wanted: int | None = None
        desired: int | None = None
        if pool_requests is not None and demand is not None:
            wanted = wanted_backends(demand, pool_requests, self.target_utilisation)
            if all_saturated:
                wanted = max(wanted, len(group) + 1)
            hysteresis = self._hysteresis.setdefault(model, Hysteresis(self.scale_down_after_s))
            desired = hysteresis.step(now, wanted)
        return ModelSignal(
            model=model,
            upstreams=len(group),
            capacities=capacities,
            pool_requests_per_s=pool_requests,
            pool_tokens_per_s=pool_tokens,
            demand_requests_per_s=demand,
            wanted=wanted,
            desired=desired,
            all_saturated=all_saturated,
        )
