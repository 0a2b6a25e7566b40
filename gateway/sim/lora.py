"""vLLM's multi-LoRA serving, as bookkeeping: which adapters are served, which are resident, what a load costs.

A vLLM started with ``--enable-lora`` serves its base model and adapters, each adapter a model name of its own
(``--lora-modules name=path`` at start, ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` at run time).
Three of its rules shape latency, and the simulator keeps them:

* **``max_loras`` per batch**: one engine step holds the requests of at most ``max_loras`` distinct adapters
  (vLLM's GPU LoRA slots). The scheduler (V1, ``vllm/v1/core/sched/scheduler.py``) admits a waiting request for
  another adapter only while fewer than ``max_loras`` adapters run; otherwise it *skips* it, leaving it in the
  waiting queue, and goes on with the requests behind it. A cold adapter's request thus waits until every
  request of some running adapter has finished (the engine applies the rule; this module only counts).
* **resident adapters, least recently used first out**: loaded adapter weights are cached in host memory, at
  most ``max_cpu_loras`` of them (vLLM's default: ``max_loras``); scheduling an adapter that is not resident
  loads it (disk -> host -> GPU slot) and evicts the least recently used resident one not in the batch.
* **a load stalls the step**: the worker activates the batch's adapters before it runs the step, so a load
  lengthens that step for every sequence in it. ``load_s`` is a fixed cost (engine seconds), loosely
  calibrated: public write-ups put a first load of a rank-8..64 adapter at tens to hundreds of milliseconds and
  a switch between cached ones at 5-15 ms (https://www.peakinfer.com/blog/switching-lora-adapters-at-runtime);
  the default 40 ms sits at the cheap end, so swaps are if anything under-priced. Copies of resident adapters
  into a free GPU slot are left out (with ``max_cpu_loras == max_loras`` the two tiers coincide).

Adapters registered at start or through the load endpoint are resident at once (vLLM's ``add_lora`` loads them
when they are registered), without counting a load: :attr:`AdapterCache.loads_total` counts the loads that
scheduling caused, the ones that cost a request time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

#: The default cost of loading a non-resident adapter when it is scheduled, in engine seconds.
DEFAULT_LOAD_S = 0.04


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """What ``--enable-lora`` and its options say: the adapters served from the start and the three limits."""

    adapters: tuple[tuple[str, str], ...] = ()  # (name, path), as --lora-modules name=path
    max_loras: int = 1  # vLLM's default
    max_cpu_loras: int | None = None  # None: max_loras, vLLM's default
    load_s: float = DEFAULT_LOAD_S

    def validate(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras (vLLM refuses it too)")
        if self.load_s < 0:
            raise ValueError("the adapter load cost must be >= 0")
        names = [name for name, _ in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError("adapter names must be unique")

    @property
    def cache_size(self) -> int:
        return self.max_cpu_loras or self.max_loras


def parse_lora_module(spec: str) -> tuple[str, str]:
    """``name=path`` (vLLM's ``--lora-modules`` form) -> (name, path); a bare name is its own path."""
    name, sep, path = spec.partition("=")
    name = name.strip()
    if not name:
        raise ValueError(f"--lora-modules {spec!r}: expected name=path")
    return name, (path.strip() if sep else name)


class AdapterCache:
    """The adapters a server knows (name -> path) and the resident ones, least recently used first."""

    __slots__ = ("_registered", "_resident", "capacity", "load_s", "loads_total", "max_loras")

    def __init__(self, config: LoraConfig) -> None:
        config.validate()
        self.max_loras = config.max_loras
        self.capacity = config.cache_size
        self.load_s = config.load_s
        self._registered: dict[str, str] = {}
        self._resident: OrderedDict[str, None] = OrderedDict()
        self.loads_total = 0  # loads caused by scheduling a non-resident adapter
        for name, path in config.adapters:
            self.register(name, path)

    # --- the served set -------------------------------------------------------------------------------
    def register(self, name: str, path: str) -> bool:
        """Serve ``name`` from now on (resident at once, evicting the least recently used beyond capacity);
        False when it is served already (vLLM answers 400)."""
        if name in self._registered:
            return False
        self._registered[name] = path
        self._make_resident(name, keep=())
        return True

    def unregister(self, name: str) -> bool:
        """Stop serving ``name``; False when it is not served (vLLM answers 404). Requests already queued for it
        run to their end, as in vLLM (the request holds its own adapter reference)."""
        if self._registered.pop(name, None) is None:
            return False
        self._resident.pop(name, None)
        return True

    def serves(self, name: str) -> bool:
        return name in self._registered

    def __contains__(self, name: object) -> bool:
        return name in self._registered

    def adapters(self) -> list[tuple[str, str]]:
        """(name, path) of every served adapter, in registration order (vLLM lists them so)."""
        return list(self._registered.items())

    def resident(self) -> list[str]:
        """Resident adapters, least recently used first."""
        return list(self._resident)

    # --- scheduling ---------------------------------------------------------------------------------------
    def activate(self, batch: Iterable[str]) -> float:
        """The adapters of one step's batch are used now: each becomes most recently used, those not resident
        are loaded (counted) and the least recently used ones outside the batch make room. Returns the step's
        added time (engine seconds)."""
        wanted = list(dict.fromkeys(batch))
        cost = 0.0
        for name in wanted:
            if name in self._resident:
                self._resident.move_to_end(name)
            else:
                self.loads_total += 1
                cost += self.load_s
                self._make_resident(name, keep=wanted)
        return cost

    def _make_resident(self, name: str, keep: Iterable[str]) -> None:
        resident = self._resident
        resident[name] = None
        resident.move_to_end(name)
        pinned = set(keep) | {name}
        while len(resident) > self.capacity:
            victim = next((n for n in resident if n not in pinned), None)
            if victim is None:  # every resident one is in the batch: never more than max_loras <= capacity
                break
            del resident[victim]
