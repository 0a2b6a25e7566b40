"""Poll one inference server's own endpoints and keep its latest :class:`BackendSnapshot`.

Reads ``/health`` (unless ``read_health=False``: the gateway's own health poll reads it already);
``/metrics`` for vLLM and llama-server; ``/props`` (``total_slots``) and ``/slots`` (busy slots, when
enabled) for llama-server. The kind is given or detected from what the
server answers: ``vllm:`` metric names mean vLLM; ``llamacpp:`` names, or a ``/props`` answer with
``total_slots`` (llama-server started without ``--metrics``), mean llama-server. A server that answers
both probes without either sign is a generic OpenAI server (``openai``): health only. While a server
is down or loading (503), detection waits and tries again on the next scrape.

Failures are data, never exceptions: a refused connection, a timeout, a 5xx or unparsable text leave
the previous numbers in place with their old ``taken_at`` and the reason in ``error``, so the age
grows visibly and a consumer (the metrics module's staleness gauge, the controller) decides what to do.

The gateway passes its own ``aiohttp.ClientSession`` (the one it proxies with); without one the
scraper opens and owns a small one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import aiohttp

from gateway.telemetry.backends.parse import (
    MetricsParseError,
    Samples,
    detect_kind,
    llama_snapshot,
    parse_samples,
    vllm_snapshot,
    with_error,
)
from gateway.telemetry.backends.snapshot import BackendKind, BackendSnapshot

KindSetting = Literal["auto", "vllm", "llamacpp", "openai"]


class _Fetch:
    """One GET's outcome: ``status`` (None when no HTTP answer) and ``body``, or ``error``."""

    __slots__ = ("body", "error", "status")

    def __init__(self, status: int | None, body: str = "", error: str | None = None) -> None:
        self.status, self.body, self.error = status, body, error

    @property
    def ok(self) -> bool:
        return self.status == 200

    def why(self, path: str) -> str:
        if self.error is not None:
            return f"GET {path}: {self.error}"
        return f"GET {path}: HTTP {self.status} {self.body[:200].strip()}"

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


_NOT_READ = _Fetch(None, error="not read")


class BackendScraper:
    """The latest snapshot of one upstream at ``base_url``; call :meth:`scrape` every tick or :meth:`run`."""

    def __init__(
        self,
        base_url: str,
        *,
        kind: KindSetting = "auto",
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 2.0,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        read_health: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._read_health = read_health  # False: ``healthy`` stays None, someone else polls /health
        self.kind: BackendKind | None = None if kind == "auto" else kind
        self._session = session
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clock = clock
        self._total_slots: int | None = None
        self.latest: BackendSnapshot = BackendSnapshot(kind=self.kind or "openai", error="not scraped yet")

    async def __aenter__(self) -> BackendScraper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _get(self, path: str) -> _Fetch:
        """One GET. A pooled connection the server already closed (llama-server closes its side after
        every streamed response, while announcing keep-alive) is retried by aiohttp itself, which
        retries idempotent requests once on a fresh connection."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.get(self.base_url + path, headers=self._headers, timeout=self._timeout) as resp:
                return _Fetch(resp.status, await resp.text(errors="replace"))
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return _Fetch(None, error=f"timed out after {self._timeout.total}s")
        except (aiohttp.ClientError, OSError) as exc:
            return _Fetch(None, error=f"{type(exc).__name__}: {exc}")

    async def _health(self) -> _Fetch:
        return await self._get("/health") if self._read_health else _NOT_READ

    async def _detect(self, metrics: _Fetch) -> BackendKind | None:
        """The kind, or None when the server cannot tell yet (down, loading)."""
        if metrics.ok:
            try:
                kind = detect_kind(parse_samples(metrics.body))
            except MetricsParseError:
                kind = None
            if kind is not None:
                return kind
        props = await self._get("/props")
        body = props.json() if props.ok else None
        if isinstance(body, dict) and "total_slots" in body:
            return "llamacpp"
        answered = [f for f in (metrics, props) if f.status is not None and f.status < 500]
        return "openai" if len(answered) == 2 else None

    async def scrape(self) -> BackendSnapshot:
        """Read the server once; update and return :attr:`latest`. Never raises (bar cancellation)."""
        if self.kind == "openai":  # nothing but health to read
            health, metrics = await self._health(), _NOT_READ
        else:
            health, metrics = await asyncio.gather(self._health(), self._get("/metrics"))
        healthy = health.ok if self._read_health else None
        if self.kind is None:
            self.kind = await self._detect(metrics)
            if self.kind is None:
                why = metrics.why("/metrics") if not metrics.ok else "backend kind not recognisable yet"
                return self._failed(f"detecting backend: {why}", healthy)
        now = self._clock()
        result: BackendSnapshot | str
        if self.kind == "vllm":
            result = self._vllm(metrics, now)
        elif self.kind == "llamacpp":
            result = await self._llama(metrics, now)
        elif self._read_health and health.status is None:
            result = health.why("/health")
        else:
            result = BackendSnapshot(kind="openai", taken_at=now)
        if isinstance(result, str):
            return self._failed(result, healthy)
        self.latest = replace(result, healthy=healthy, error=None)
        return self.latest

    def _failed(self, error: str, healthy: bool | None) -> BackendSnapshot:
        self._total_slots = None  # a restarted llama-server may come back with another --parallel
        previous = self.latest
        if self.kind is not None and previous.kind != self.kind:
            previous = BackendSnapshot(kind=self.kind)
        self.latest = with_error(previous, error, healthy)
        return self.latest

    def _samples(self, metrics: _Fetch) -> Samples | str:
        if not metrics.ok:
            return metrics.why("/metrics")
        try:
            return parse_samples(metrics.body)
        except MetricsParseError as exc:
            return f"GET /metrics: {exc}"

    def _vllm(self, metrics: _Fetch, now: float) -> BackendSnapshot | str:
        samples = self._samples(metrics)
        if isinstance(samples, str):
            return samples
        return vllm_snapshot(samples, now)

    async def _llama(self, metrics: _Fetch, now: float) -> BackendSnapshot | str:
        # 501: started without --metrics (or --no-slots); what remains is still worth reading.
        if metrics.status not in (200, 501):
            return metrics.why("/metrics")
        samples = self._samples(metrics) if metrics.ok else None
        if isinstance(samples, str):
            return samples
        wanted = [self._get("/slots")]
        if self._total_slots is None:  # fixed for a process's life: read /props until it answers
            wanted.append(self._get("/props"))
        answers = await asyncio.gather(*wanted)
        slots_body = answers[0].json() if answers[0].ok else None
        if len(answers) > 1 and answers[1].ok:
            props = answers[1].json()
            if isinstance(props, dict) and isinstance(props.get("total_slots"), int):
                self._total_slots = props["total_slots"]
        slots = slots_body if isinstance(slots_body, list) else None
        props_view = {"total_slots": self._total_slots} if self._total_slots is not None else None
        return llama_snapshot(samples, now, props_view, slots)

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """Scrape every ``interval_s`` until ``stop`` is set (a background task of the gateway)."""
        while not stop.is_set():
            await self.scrape()
            try:
                async with asyncio.timeout(interval_s):
                    await stop.wait()
            except TimeoutError:
                pass
