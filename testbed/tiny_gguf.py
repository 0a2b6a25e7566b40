"""Generate a small llama-architecture GGUF model with random weights, for tests and benchmarks.

Why: the integration tests need a *real* llama-server doing *real* decoding work on the CPU, and nothing may
download model weights. A ~20M-parameter f32 model is big enough that one decode step is measurable work
(so concurrency curves have a knee) and small enough to load in well under a second. The outputs are
gibberish; tests control length with ``max_tokens`` and ``ignore_eos``.

Tokenizer choice: GPT-2 style byte-level BPE (``tokenizer.ggml.model = "gpt2"``, pre-tokenizer ``gpt-2``) whose
alphabet is restricted to printable ASCII plus space, newline and tab, with a few hundred merges built from
common English words, and one control token ``<|endoftext|>`` (BOS = EOS). Restricting the alphabet means every
sampleable token except EOS decodes to non-empty, valid ASCII, so llama-server streams exactly one SSE chunk
per generated token (byte tokens >= 0x80 would be held back as incomplete UTF-8 and merge chunks). With
``ignore_eos`` llama.cpp bans EOS, so every generated token is text. Input bytes outside the alphabet are
dropped by llama.cpp's BPE tokenizer; tests send ASCII prompts.

Files are cached under ``${SWEETSPOT_CACHE_DIR:-~/.cache/sweetspot}/models/`` keyed by a hash of the shape,
the seed and ``GENERATOR_VERSION``, and written atomically (temp file + rename).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# Bump when the file layout or tokenizer changes, so cached files from an older generator are not reused.
GENERATOR_VERSION = 1

# Words whose left-to-right merges make up the BPE merge list ("Ġ" marks a leading space, as in GPT-2).
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "that",
    "for",
    "it",
    "with",
    "as",
    "his",
    "on",
    "be",
    "at",
    "by",
    "had",
    "are",
    "but",
    "from",
    "or",
    "have",
    "an",
    "they",
    "which",
    "one",
    "you",
    "were",
    "her",
    "all",
    "she",
    "there",
    "would",
    "their",
    "we",
    "him",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
EOS_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the generated model. The defaults give ~21M parameters (~85 MB as f32)."""

    n_embd: int = 512
    n_layer: int = 8
    n_head: int = 8
    n_head_kv: int = 8
    n_ff: int = 1024
    n_ctx_train: int = 4096
    seed: int = 1234
    init_std: float = 0.02

    def key(self) -> str:
        """Stable cache key: the spec plus the generator version."""
        blob = json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode mapping (as in OpenAI's encoder.py and llama.cpp)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_vocab() -> tuple[list[str], list[str]]:
    """Return (tokens, merges): EOS first, then the ASCII alphabet, then one token per merge."""
    b2u = _byte_to_unicode()
    alphabet = [b2u[b] for b in [9, 10, *range(32, 127)]]
    tokens = [EOS_TEXT, *alphabet]
    known = set(tokens)
    merges: list[str] = []
    for word in _WORDS:
        pieces = [b2u[32], *word]  # leading space, the common case in running text
        left = pieces[0]
        for right in pieces[1:]:
            merged = left + right
            if merged not in known:
                merges.append(f"{left} {right}")
                tokens.append(merged)
                known.add(merged)
            left = merged
    return tokens, merges


def parameter_count(spec: TinyModelSpec, n_vocab: int) -> int:
    """Number of weights in the file (embeddings, untied output, all blocks, norms)."""
    head_dim = spec.n_embd // spec.n_head
    attn = spec.n_embd * spec.n_embd * 2 + 2 * spec.n_embd * head_dim * spec.n_head_kv
    ffn = 3 * spec.n_embd * spec.n_ff
    per_layer = attn + ffn + 2 * spec.n_embd
    return 2 * n_vocab * spec.n_embd + spec.n_layer * per_layer + spec.n_embd


def write_model(path: Path, spec: TinyModelSpec) -> None:
    """Write the model to ``path`` (not atomic; see ``ensure_model``)."""
    import gguf  # heavy import, only when we actually write

    if spec.n_embd % spec.n_head or spec.n_head % spec.n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    tokens, merges = build_vocab()
    n_vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    rng = np.random.default_rng(spec.seed)

    def weight(rows: int, cols: int) -> np.ndarray:
        # numpy shape (out, in) == ggml ne = [in, out], the layout llama.cpp expects for matmul weights.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * spec.init_std).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"sweetspot-tiny-{spec.key()}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (n_vocab - 1))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", weight(n_vocab, spec.n_embd))
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(head_dim * spec.n_head_kv, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(head_dim * spec.n_head_kv, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(spec.n_embd, spec.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, spec.n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cache_dir() -> Path:
    """Root of the sweetspot cache (shared with scripts/build-llama-server.sh)."""
    return Path(os.environ.get("SWEETSPOT_CACHE_DIR") or Path.home() / ".cache" / "sweetspot")


def ensure_model(spec: TinyModelSpec = TinyModelSpec(), out: Path | None = None) -> Path:
    """Return the path of the model for ``spec``, generating it first when missing.

    Written to a temp file in the destination directory and renamed into place, so concurrent test
    sessions and interrupted runs never see a half-written model.
    """
    path = out if out is not None else cache_dir() / "models" / f"tiny-llama-{spec.key()}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write_model(Path(tmp), spec)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write here instead of the cache")
    defaults = TinyModelSpec()
    for field, value in asdict(defaults).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    spec = TinyModelSpec(**{f: getattr(args, f) for f in asdict(defaults)})
    path = ensure_model(spec, args.out)
    tokens, _ = build_vocab()
    print(f"{path}  ({parameter_count(spec, len(tokens)) / 1e6:.1f}M parameters, vocab {len(tokens)})")


if __name__ == "__main__":
    main()
