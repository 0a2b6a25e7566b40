"""Deterministic stand-ins for a tokenizer, a sampler and an embedding model.

The simulator has no vocabulary, so it needs rules a client can predict:

* a prompt costs ``ceil(utf8_bytes / 4)`` tokens per text (about what BPE tokenizers give for
  English), a chat adds the template's tokens (``CHAT_TOKENS_PER_MESSAGE`` per message plus
  ``CHAT_TOKENS_REPLY`` for the assistant turn), and a ``/v1/completions`` prompt given as a
  list of token ids costs exactly its length - the way to ask for an exact prompt size;
* each generated token is one short word picked from a fixed list by a hash of the prompt and the
  token's position, so the same request always gets the same text;
* an embedding is a unit vector drawn from a generator seeded by the text's hash;
* a prompt's *token ids* (what prefix caching hashes) are its text cut into 4-byte pieces, each piece one
  id, with the chat template's tokens as ids of their own that name the role: two prompts share a leading
  run of ids exactly when they share a leading run of text, as with a real tokenizer, and the count is the
  same as the rule above.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from typing import Any

import numpy as np

BYTES_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4  # <|im_start|>role\n ... <|im_end|>\n
CHAT_TOKENS_REPLY = 3  # <|im_start|>assistant\n

WORDS: tuple[str, ...] = tuple(
    [
        "lorem",
        "ipsum",
        "dolor",
        "sit",
        "amet",
        "consectetur",
        "adipiscing",
        "elit",
        "sed",
        "do",
        "eiusmod",
        "tempor",
        "incididunt",
        "ut",
        "labore",
        "et",
        "dolore",
        "magna",
        "aliqua",
        "enim",
        "ad",
        "minim",
        "veniam",
        "quis",
        "nostrud",
        "exercitation",
        "ullamco",
        "laboris",
        "nisi",
        "aliquip",
        "ex",
        "ea",
        "commodo",
        "consequat",
        "duis",
        "aute",
        "irure",
        "in",
        "reprehenderit",
        "voluptate",
        "velit",
        "esse",
        "cillum",
        "fugiat",
        "nulla",
        "pariatur",
        "excepteur",
        "sint",
        "occaecat",
        "cupidatat",
        "non",
        "proident",
        "sunt",
        "culpa",
        "qui",
        "officia",
        "deserunt",
        "mollit",
        "anim",
        "id",
        "est",
        "laborum",
    ]
)


def text_tokens(text: str) -> int:
    """Tokens of one text: a quarter of its UTF-8 bytes, rounded up."""
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def text_of_tokens(n: int) -> str:
    """A text that :func:`text_tokens` counts as exactly ``n`` tokens (for clients that need one)."""
    return ("abc " * n)[: BYTES_PER_TOKEN * n]


def message_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string, or a list of parts with ``text``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise TypeError("message content must be a string or a list of content parts")


def chat_prompt_tokens(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(prompt tokens, text seed) of a chat request."""
    total = CHAT_TOKENS_REPLY
    crc = 0
    for m in messages:
        text = message_text(m.get("content"))
        total += CHAT_TOKENS_PER_MESSAGE + text_tokens(text)
        crc = zlib.crc32(text.encode("utf-8"), crc)
    return total, crc


def completion_prompt_tokens(prompt: str | list[int]) -> tuple[int, int]:
    """(prompt tokens, text seed) of a completions request: a string, or a list of token ids."""
    if isinstance(prompt, str):
        return max(1, text_tokens(prompt)), zlib.crc32(prompt.encode("utf-8"))
    return len(prompt), zlib.crc32(repr(prompt[:64]).encode())


def text_token_ids(text: str) -> list[int]:
    """The ids of :func:`text_tokens`' tokens: each 4-byte piece of the UTF-8 text, read as an integer."""
    data = text.encode("utf-8")
    return [int.from_bytes(data[i : i + BYTES_PER_TOKEN], "little") for i in range(0, len(data), BYTES_PER_TOKEN)]


_TEMPLATE_ID = 1 << 40  # above any 4-byte piece: template tokens never equal text tokens


def chat_token_ids(messages: list[dict[str, Any]]) -> list[int]:
    """A chat prompt's token ids, as many as :func:`chat_prompt_tokens` counts: per message the template's
    tokens (which carry the role) and the content's, then the reply's template tokens."""
    ids: list[int] = []
    for m in messages:
        role = zlib.crc32(str(m.get("role", "")).encode("utf-8"))
        ids += [_TEMPLATE_ID, _TEMPLATE_ID + 1 + role, _TEMPLATE_ID, _TEMPLATE_ID + 1]
        ids += text_token_ids(message_text(m.get("content")))
    return [*ids, _TEMPLATE_ID, _TEMPLATE_ID + 2, _TEMPLATE_ID]


def block_hashes(token_ids: list[int], block_size: int) -> tuple[int, ...]:
    """vLLM's prefix-cache keys: one hash per *full* block of ``block_size`` ids, each chained over the hash
    of the block before it, so equal hashes mean equal prefixes up to that block's end. (Python's hash of a
    tuple of integers does not depend on the process, so every simulator computes the same keys.)"""
    out: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        out.append(parent)
    return tuple(out)


def word(seed: int, index: int) -> str:
    """The ``index``-th generated word of a request seeded with ``seed`` (leading space included)."""
    h = (seed * 0x9E3779B1 + index * 0x85EBCA77) & 0xFFFFFFFF
    h ^= h >> 15
    return " " + WORDS[h % len(WORDS)]


def generated_text(seed: int, n: int) -> str:
    return "".join(word(seed, i) for i in range(n))


def embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text``."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    v = rng.standard_normal(dim)
    v /= math.sqrt(float(v @ v)) or 1.0
    return v.astype(np.float32).tolist()


def embedding_base64(vector: list[float]) -> str:
    """OpenAI's ``encoding_format="base64"``: little-endian float32 bytes, base64-encoded."""
    import base64

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
