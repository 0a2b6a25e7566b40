"""The test-model generator, read back with gguf's own reader (llama-server loading it is the integration test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from testbed.tiny_gguf import EOS_TEXT, TinyModelSpec, build_vocab, ensure_model, parameter_count

SMALL = TinyModelSpec(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, n_ctx_train=256, seed=7)


def field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def test_vocab_is_ascii_text_plus_one_control_token() -> None:
    tokens, merges = build_vocab()
    assert tokens[0] == EOS_TEXT and len(set(tokens)) == len(tokens)
    known = set(tokens)
    for merge in merges:  # every merge joins two known tokens into a known token
        left, right = merge.split(" ")
        assert left in known and right in known and left + right in known
    # byte-level BPE: a leading space is "Ġ", newline "Ċ"; everything else is printable ASCII
    decode = {"Ġ": " ", "Ċ": "\n", "ĉ": "\t"}
    for token in tokens[1:]:
        text = "".join(decode.get(ch, ch) for ch in token)
        assert text and all(c in "\t\n" or 32 <= ord(c) < 127 for c in text), token


def test_written_model_reads_back_with_its_shape_and_tokenizer(tmp_path: Path) -> None:
    path = ensure_model(SMALL, tmp_path / "m.gguf")
    reader = GGUFReader(path)
    tokens, merges = build_vocab()
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "llama.embedding_length") == 64
    assert field(reader, "llama.block_count") == 2
    assert field(reader, "llama.attention.head_count_kv") == 2
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert field(reader, "tokenizer.ggml.tokens") == tokens
    assert field(reader, "tokenizer.ggml.merges") == merges
    assert field(reader, "tokenizer.ggml.eos_token_id") == 0
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert shapes["token_embd.weight"] == (64, len(tokens))  # ggml order: (n_embd, n_vocab)
    assert shapes["blk.1.attn_k.weight"] == (64, 32)  # 2 KV heads of 16
    assert shapes["blk.0.ffn_down.weight"] == (128, 64)
    assert sum(int(np.prod(s)) for s in shapes.values()) == parameter_count(SMALL, len(tokens))
    assert all(t.tensor_type.name == "F32" for t in reader.tensors)


def test_same_spec_same_bytes_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = ensure_model(SMALL, tmp_path / "a.gguf")
    b = ensure_model(SMALL, tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()  # seeded: reproducible
    monkeypatch.setenv("SWEETSPOT_CACHE_DIR", str(tmp_path / "cache"))
    cached = ensure_model(SMALL)
    assert cached.parent == tmp_path / "cache" / "models" and SMALL.key() in cached.name
    mtime = cached.stat().st_mtime_ns
    assert ensure_model(SMALL) == cached and cached.stat().st_mtime_ns == mtime  # reused, not rewritten
    other = ensure_model(TinyModelSpec(**{**SMALL.__dict__, "seed": 8}))
    assert other != cached and other.read_bytes() != cached.read_bytes()
    assert [p.name for p in cached.parent.iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_default_model_is_about_twenty_million_parameters() -> None:
    tokens, _ = build_vocab()
    assert 19e6 < parameter_count(TinyModelSpec(), len(tokens)) < 23e6
