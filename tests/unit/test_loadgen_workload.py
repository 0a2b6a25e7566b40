"""Length distributions, request bodies and SSE decoding of the load generator."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.sweep.client import SSEDecoder, normalize_base_url
from gateway.sweep.workload import LengthDist, RequestFactory, Workload, parse_length


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("128", LengthDist("fixed", 128)),
        (64, LengthDist("fixed", 64)),
        ("64..256", LengthDist("uniform", 64, 256)),
        ("uniform:64,256", LengthDist("uniform", 64, 256)),
        ("normal:128,32", LengthDist("normal", 128, 32)),
        ("lognormal:128,64", LengthDist("lognormal", 128, 64)),
    ],
)
def test_parse_length(spec: str, expected: LengthDist) -> None:
    assert parse_length(spec) == expected


@pytest.mark.parametrize("spec", ["", "abc", "normal:128", "fixed:1,2", "0", "uniform:9,3", "gamma:1,2"])
def test_parse_length_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_length(spec)


def test_distributions_have_their_moments() -> None:
    rng = np.random.default_rng(1)
    uniform = [LengthDist("uniform", 10, 20).sample(rng) for _ in range(4000)]
    assert min(uniform) == 10 and max(uniform) == 20
    normal = np.array([LengthDist("normal", 200, 20).sample(rng) for _ in range(4000)])
    assert abs(normal.mean() - 200) < 2 and abs(normal.std() - 20) < 2
    lognormal = np.array([LengthDist("lognormal", 200, 100).sample(rng) for _ in range(8000)])
    assert abs(lognormal.mean() - 200) < 6 and abs(lognormal.std() - 100) < 8  # moments of the lengths
    assert LengthDist("normal", 2, 50).sample(rng) >= 1  # clipped, never zero or negative


def test_factory_is_deterministic_and_builds_openai_bodies() -> None:
    workload = Workload(
        api="chat",
        prompt_len=parse_length("8..16"),
        output_len=parse_length("32"),
        seed=7,
        extra_body={"temperature": 0},
    )
    first = [RequestFactory(workload, stream_id=3).next() for _ in range(2)]
    assert first[0] == first[1]
    spec = first[0]
    assert spec.body["max_tokens"] == 32 and spec.body["ignore_eos"] is True and spec.body["temperature"] == 0
    assert spec.body["stream"] is True and spec.body["stream_options"] == {"include_usage": True}
    content = spec.body["messages"][0]["content"]
    assert content.startswith("r0: ") and len(content.split()) == spec.prompt_len  # marker + words
    factory = RequestFactory(Workload(api="completions", ignore_eos=False))
    a, b = factory.next(), factory.next()
    assert "prompt" in a.body and "ignore_eos" not in a.body
    assert a.body["prompt"][:4] != b.body["prompt"][:4]  # unique prefixes: no prefix-cache hits


def test_sse_decoder_handles_split_lines_crlf_comments_and_unterminated_events() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a"') == []
    assert decoder.feed(b": 1}\r\n\r\n: ping\n\ndata: [DONE]\n") == [b'{"a": 1}']
    assert decoder.feed(b"\n") == [b"[DONE]"]
    decoder.feed(b'data: {"b": 2}')
    assert decoder.close() == [b'{"b": 2}']


def test_base_url_normalization() -> None:
    assert normalize_base_url("http://h:1/v1/") == "http://h:1"
    assert normalize_base_url("http://h:1") == "http://h:1"
