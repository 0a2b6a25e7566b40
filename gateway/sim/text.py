"""Deterministic stand-ins for a tokenizer, a sampler and an embedding model.

The simulator has no vocabulary, so it needs rules a client can predict:

* a prompt costs ``ceil(utf8_bytes / 4)`` tokens per text (about what BPE tokenizers give for
  English), a chat adds the template's tokens (``CHAT_TOKENS_PER_MESSAGE`` per message plus
  ``CHAT_TOKENS_REPLY`` for the assistant turn), and a ``/v1/completions`` prompt given as a
  list of token ids costs exactly its length - the way to ask for an exact prompt size;
* each generated token is one short word picked from a fixed list by a hash of the prompt and the
  token's position, so the same request always gets the same text;
* an embedding is a unit vector drawn from a generator seeded by the text's hash.
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
    (
        "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
        "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
        "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
        "cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
        "officia deserunt mollit anim id est laborum"
    ).split()
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
