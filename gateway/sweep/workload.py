"""What the load generator sends: prompt and output lengths, and the request bodies built from them.

Lengths are fixed or drawn from a seeded distribution, so two runs with the same seed send the same
requests. Output length is pinned with ``max_tokens`` plus ``ignore_eos`` (honoured by vLLM and
llama-server), because a benchmark whose requests stop early at EOS measures the model's verbosity,
not the server. Without a tokenizer we cannot build a prompt of exactly N tokens; common short English
words come out at about one token each in every BPE vocabulary we know, and the server's reported
``prompt_tokens`` (kept per request) says what was really sent. Each prompt starts with a unique
marker so prefix caching cannot turn the prefill of a benchmark into a cache hit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

ApiKind = Literal["chat", "completions", "responses", "messages"]
DistKind = Literal["fixed", "uniform", "normal", "lognormal"]

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
]


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of token counts. ``a``/``b`` mean: fixed (a), uniform [a, b], normal and
    lognormal (mean a, standard deviation b, of the lengths themselves). Draws are rounded and
    clipped to at least 1."""

    kind: DistKind
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.a < 1 or (self.kind == "uniform" and self.b < self.a) or self.b < 0:
            raise ValueError(f"invalid length distribution {self.describe()}")

    def sample(self, rng: np.random.Generator) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = float(rng.integers(int(self.a), int(self.b) + 1))
        elif self.kind == "normal":
            value = float(rng.normal(self.a, self.b))  # a Python float: round() gives an int
        else:  # lognormal parameterised by the mean and std of the lengths, not of their logarithm
            sigma2 = math.log1p((self.b / self.a) ** 2)
            value = float(rng.lognormal(math.log(self.a) - sigma2 / 2, math.sqrt(sigma2)))
        return max(1, round(value))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    @property
    def shortest(self) -> int:
        """The shortest a draw can be (1 for normal and lognormal, whose draws are clamped there)."""
        if self.kind == "fixed":
            return max(1, round(self.a))
        return max(1, int(self.a)) if self.kind == "uniform" else 1

    @property
    def longest(self) -> int | None:
        """The longest a draw can be; None for normal and lognormal, whose draws have no bound."""
        if self.kind == "fixed":
            return max(1, round(self.a))
        return int(self.b) if self.kind == "uniform" else None

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        if self.kind == "uniform":
            return f"uniform:{self.a:g},{self.b:g}"
        return f"{self.kind}:{self.a:g},{self.b:g}"


_SPEC = re.compile(r"^(?:(fixed|uniform|normal|lognormal):)?\s*(\d+(?:\.\d+)?)\s*(?:(?:,|\.\.|-)\s*(\d+(?:\.\d+)?))?$")


def parse_length(spec: str | int) -> LengthDist:
    """Parse ``128``, ``64..256`` / ``uniform:64,256``, ``normal:128,32`` or ``lognormal:128,64``."""
    text = str(spec).strip().lower()
    match = _SPEC.match(text)
    if not match:
        raise ValueError(
            f"cannot read length {spec!r}: use N, A..B, uniform:A,B, normal:MEAN,STD or lognormal:MEAN,STD"
        )
    kind, a, b = match.group(1), float(match.group(2)), match.group(3)
    if kind is None:
        kind = "fixed" if b is None else "uniform"
    if kind == "fixed":
        if b is not None:
            raise ValueError(f"a fixed length takes one number, got {spec!r}")
        return LengthDist("fixed", a)
    if b is None:
        raise ValueError(f"{kind} needs two numbers, got {spec!r}")
    return LengthDist(kind, a, float(b))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Workload:
    """The shape of every request a run sends."""

    api: ApiKind = "chat"
    prompt_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 256))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    ignore_eos: bool = True
    seed: int = 0
    extra_body: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "api": self.api,
            "prompt_len": self.prompt_len.describe(),
            "output_len": self.output_len.describe(),
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "extra_body": dict(self.extra_body),
        }


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request, ready to send: the lengths it was drawn with and its JSON body (model left out)."""

    index: int
    prompt_len: int
    max_tokens: int
    body: dict[str, Any]


def make_prompt(index: int, length: int, rng: np.random.Generator) -> str:
    """About ``length`` tokens of words, led by a marker unique to ``index`` (defeats prefix caches)."""
    words = rng.choice(len(_WORDS), size=max(0, length - 1))
    return f"r{index}: " + " ".join(_WORDS[i] for i in words)


class RequestFactory:
    """Draws request after request from a :class:`Workload`; deterministic for a given seed."""

    def __init__(self, workload: Workload, *, stream_id: int = 0) -> None:
        self.workload = workload
        self._rng = np.random.default_rng([workload.seed, stream_id])
        self._next = 0

    def next(self) -> RequestSpec:
        index = self._next
        self._next += 1
        wl = self.workload
        prompt_len = wl.prompt_len.sample(self._rng)
        max_tokens = wl.output_len.sample(self._rng)
        prompt = make_prompt(index, prompt_len, self._rng)
        body: dict[str, Any] = {"stream": True}
        if wl.api == "responses":  # usage always comes in response.completed
            body.update(input=prompt, max_output_tokens=max_tokens)
        elif wl.api == "messages":  # usage always comes in message_start / message_delta
            body.update(messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)
        else:
            body.update(max_tokens=max_tokens, stream_options={"include_usage": True})
            if wl.api == "chat":
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
        if wl.ignore_eos:
            body["ignore_eos"] = True
        body.update(wl.extra_body)
        return RequestSpec(index=index, prompt_len=prompt_len, max_tokens=max_tokens, body=body)
