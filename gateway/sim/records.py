"""What the engine keeps about a request, and what one step reports.

Kept apart from the scheduler (:mod:`gateway.sim.engine`) because everything that consumes the
engine (the HTTP runner, the scenario harness, the oracle, the tests) reads these records, while
only the engine writes them. A sequence is one small slotted object on purpose: long runs hold
thousands of them, and stepping touches each one every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"

FINISH_LENGTH = "length"  # produced max_tokens
FINISH_STOP = "stop"  # drew the end-of-sequence token
FINISH_ABORT = "abort"  # aborted by the caller (client disconnected)
FINISH_ERROR = "error"  # could never fit in the KV cache


class Sequence:
    """One request inside the engine. Times are on the engine's clock; ``None`` until they happen."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached",
        "cached_tokens",
        "computed",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "generated",
        "hashes",
        "id",
        "last_token_at",
        "lora",
        "max_tokens",
        "preemptions",
        "prompt_len",
        "scheduled_at",
        "state",
        "target_len",
    )

    def __init__(
        self,
        sid: int,
        prompt_len: int,
        max_tokens: int,
        target_len: int,
        arrival: float,
        hashes: tuple[int, ...] = (),
        lora: str | None = None,
    ):
        self.id = sid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.target_len = target_len  # tokens it will produce before finishing
        self.generated = 0  # tokens produced (and delivered) so far
        self.computed = 0  # tokens whose KV is cached
        self.blocks = 0  # KV (+ recurrent state) blocks held privately, besides those in ``cached``
        self.state = WAITING
        self.arrival = arrival
        self.scheduled_at: float | None = None  # first time it entered a batch
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        self.finish_reason: str | None = None
        self.preemptions = 0
        self.hashes = hashes  # chained hashes of the prompt's full blocks (prefix caching); empty: none
        self.cached: list[int] = []  # leading hashes whose blocks it holds through the prefix cache
        self.cached_tokens = 0  # prompt tokens found in the prefix cache when it was last scheduled
        self.lora = lora  # the LoRA adapter it runs with; None: the base model

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.id}, state={self.state}, prompt={self.prompt_len}, "
            f"generated={self.generated}/{self.target_len}, computed={self.computed})"
        )


@dataclass(slots=True)
class StepResult:
    """What one engine step did. ``tokens`` holds each sequence that produced a token (once per step)."""

    start: float
    end: float
    tokens: list[int] = field(default_factory=list)
    first_tokens: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    decode_seqs: int = 0
    prefill_tokens: int = 0
    kv_tokens: int = 0
    lora_load_s: float = 0.0  # of the step's duration, the time spent loading adapters that were not resident

    @property
    def duration(self) -> float:
        return self.end - self.start
