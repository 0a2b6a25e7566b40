"""Per-request measurement: one :class:`RequestTracker` follows a request from arrival to its last
byte and, when it ends, writes a :class:`RequestSample` into its upstream's window and the metrics.

Streamed tokens are credited to the window as they arrive, then corrected with the usage the upstream
reports at the end, so the controller sees throughput while long streams are still running and the
totals still match the backend's own count. A request that is not streamed is registered with its
upstream's window while it is in flight and brings its tokens with its sample (the window spreads them
over its life): readings that overlap it wait for its count (``gateway.control.knee_search.meter``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.control.window import Outcome, RequestSample
from gateway.server.admission.tenants import Tenant
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.metrics import GatewayMetrics


@dataclass
class RequestTracker:
    arrived: float
    clock: Callable[[], float] = time.monotonic
    model: str = ""  # the metrics' label: the name when an upstream lists it, else `other` (bounded)
    requested_model: str = ""  # the name the client sent, for the access log
    served_model: str = ""  # the name that went upstream (an alias's or the default's; else the client's)
    upstream: Upstream | None = None
    admitted: float | None = None
    queue_wait: float = 0.0
    first_token: float | None = None
    streamed_tokens: int = 0
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    streamed: bool = False
    outcome: Outcome | None = None  # how it ended upstream, once finished
    finished: float | None = None
    tenant: Tenant | None = None
    done: bool = field(default=False, repr=False)
    _open: tuple[Upstream, int] | None = field(default=None, repr=False)  # where it is registered in flight

    def admit(self, upstream: Upstream, admitted: float, queue_wait: float) -> None:
        self.upstream = upstream
        self.admitted = admitted
        self.queue_wait = queue_wait
        if self.tenant is not None:
            self.tenant.count_wait(queue_wait)

    def switch(self, upstream: Upstream) -> None:
        """The request goes to ``upstream`` now (its first attempt, or a failover before any byte)."""
        self._close()
        self.upstream = upstream
        if not self.streamed and self.admitted is not None:
            self._open = (upstream, upstream.window.opened(self.admitted))

    def _close(self) -> None:
        if self._open is not None:
            upstream, key = self._open
            upstream.window.closed(key)
            self._open = None

    def tokens(self, count: int, now: float) -> None:
        """``count`` output tokens just arrived on the stream."""
        if self.first_token is None:
            self.first_token = now
        self.streamed_tokens += count
        assert self.upstream is not None
        self.upstream.window.add_tokens(now, count)

    def usage(self, usage: dict) -> None:
        prompt = usage.get("prompt_tokens")
        output = usage.get("completion_tokens")
        if isinstance(prompt, int):
            self.prompt_tokens = prompt
        if isinstance(output, int):
            self.output_tokens = output

    def failed_attempt(self, metrics: GatewayMetrics, outcome: Outcome = Outcome.UPSTREAM_ERROR) -> RequestSample:
        """The current upstream failed before answering and the request moves on to another one:
        its window still learns of the error (``outcome``: a 404 for a model it does not serve is the client's
        kind, no failure of the upstream), the request itself is not finished. Returns that sample."""
        assert self.upstream is not None and self.admitted is not None
        now = self.clock()
        sample = RequestSample(
            arrived=self.arrived,
            admitted=self.admitted,
            finished=now,
            first_token=None,
            prompt_tokens=0,
            output_tokens=0,
            outcome=outcome,
            streamed=self.streamed,
        )
        self.upstream.window.add(sample)
        metrics.child(metrics.upstream_requests, self.upstream.name, outcome.value, self.model).inc()
        return sample

    def finish(self, outcome: Outcome, metrics: GatewayMetrics) -> RequestSample | None:
        """Record the request once (later calls are no-ops). Returns the sample it recorded."""
        if self.done or self.upstream is None or self.admitted is None:
            return None
        self.done = True
        self._close()
        now = self.clock()
        self.outcome, self.finished = outcome, now
        upstream = self.upstream
        output = self.output_tokens if self.output_tokens is not None else self.streamed_tokens
        correction = output - self.streamed_tokens
        if correction and self.streamed:  # a whole answer's tokens come with its sample
            upstream.window.add_tokens(now, correction)
        sample = RequestSample(
            arrived=self.arrived,
            admitted=self.admitted,
            finished=now,
            first_token=self.first_token if self.streamed else None,
            prompt_tokens=self.prompt_tokens or 0,
            output_tokens=output,
            outcome=outcome,
            streamed=self.streamed,
        )
        upstream.window.add(sample)
        label, model = upstream.name, self.model
        if self.tenant is not None:
            self.tenant.spend(output, now)  # its quota and its output-token count
        child = metrics.child
        child(metrics.upstream_requests, label, outcome.value, model).inc()
        if self.prompt_tokens:
            child(metrics.prompt_tokens, label, model).inc(self.prompt_tokens)
        if output > 0:
            child(metrics.output_tokens, label, model).inc(output)
        if outcome is Outcome.OK:
            # Sizes of completed requests only: a cancelled one's output says when the client left.
            if self.prompt_tokens is not None:
                child(metrics.request_prompt_tokens, label, model).observe(self.prompt_tokens)
            child(metrics.request_output_tokens, label, model).observe(output)
            child(metrics.e2e, label).observe(sample.e2e)
            ttft, upstream_ttft, tpot = sample.ttft, sample.upstream_ttft, sample.tpot
            if ttft is not None and upstream_ttft is not None:
                child(metrics.ttft, label).observe(ttft)
                child(metrics.upstream_ttft, label).observe(upstream_ttft)
            if tpot is not None:
                child(metrics.tpot, label).observe(tpot)
        return sample

    def access_fields(self) -> dict[str, Any]:
        """The access log's view of the request: where it went, how long each part took, its tokens.
        Times in seconds; a field that does not apply (no upstream, no first token) is null."""
        end = self.finished if self.finished is not None else self.clock()
        upstream = self.upstream
        first = self.first_token if self.streamed else None
        output = self.output_tokens if self.output_tokens is not None else self.streamed_tokens
        return {
            "upstream": upstream.name if upstream is not None else None,
            "model": self.served_model or self.requested_model or None,
            "client_model": self.requested_model or None,
            "outcome": self.outcome.value if self.outcome is not None else None,
            "streamed": self.streamed,
            "queue_wait_s": round(self.queue_wait, 6),
            "ttft_s": round(first - self.arrived, 6) if first is not None else None,
            "e2e_s": round(end - self.arrived, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": output if upstream is not None else None,
        }
