"""Write a random-weight model as a Hugging Face directory that vLLM can serve, with no download.

Run with the vLLM virtualenv's python (it needs torch, transformers and tokenizers, which the gateway's own
environment must not carry)::

    $VLLM_VENV/bin/python testbed/vllm_venv/make_hf_model.py --out DIR --layers 4 --hidden 256 ...
    $VLLM_VENV/bin/python testbed/vllm_venv/make_hf_model.py --out DIR --model-type mixtral \
        --config '{"num_local_experts": 4, "num_experts_per_tok": 2}'

``--model-type`` is any Transformers ``model_type`` with a causal-LM class (llama by default; mistral,
gemma3_text, mixtral, deepseek_v2, qwen3_next, ...); the common sizes come from the flags and ``--config``
adds or overrides that family's own fields (sliding windows, experts, MLA ranks, linear-attention heads).

What it writes: ``config.json``, ``generation_config.json``, ``model.safetensors`` (bf16), and a byte-level BPE
tokenizer trained here on generated text (every byte encodes, so any prompt works) with a chat template, so
``/v1/chat/completions`` works too. Weights are random with a fixed seed: the text is noise, but every cost
that matters to a server (weight reads per decode step, KV cache per token, scheduling) is a real model's.
The directory is written next to ``--out`` and renamed into place, so a killed run leaves no half model.

This file imports nothing from the project: it runs in another interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "any",
    "new",
    "work",
    "part",
    "take",
    "get",
    "place",
    "made",
    "live",
    "where",
    "after",
    "back",
    "little",
    "only",
    "round",
    "man",
    "year",
    "came",
    "show",
    "every",
    "good",
    "me",
    "give",
    "our",
    "under",
    "name",
    "very",
    "through",
    "just",
    "form",
    "sentence",
    "great",
    "think",
    "say",
    "help",
    "low",
    "line",
    "differ",
    "turn",
    "cause",
    "much",
    "mean",
    "before",
    "move",
    "right",
    "boy",
    "old",
    "too",
    "same",
    "tell",
    "does",
    "set",
    "three",
    "want",
    "air",
    "well",
    "also",
    "play",
    "small",
    "end",
    "put",
    "home",
    "read",
    "hand",
    "port",
    "large",
    "spell",
    "add",
    "even",
    "land",
    "here",
    "must",
    "big",
    "high",
    "such",
    "follow",
    "act",
    "why",
    "ask",
    "men",
    "change",
    "went",
    "light",
    "kind",
    "off",
    "need",
    "house",
    "picture",
    "try",
    "us",
    "again",
    "animal",
    "point",
    "mother",
    "world",
    "near",
    "build",
    "self",
    "earth",
    "father",
    "head",
    "stand",
    "own",
    "page",
    "should",
    "country",
    "found",
    "answer",
    "school",
    "grow",
    "study",
    "still",
    "learn",
    "plant",
    "cover",
    "food",
    "sun",
    "four",
    "between",
    "state",
    "keep",
    "eye",
    "never",
    "last",
    "let",
    "thought",
    "city",
    "tree",
    "cross",
    "farm",
    "hard",
    "start",
    "might",
    "story",
    "saw",
    "far",
    "sea",
    "draw",
    "left",
    "late",
    "run",
    "don't",
    "while",
    "press",
    "close",
    "night",
    "real",
    "life",
    "few",
    "north",
    "open",
    "seem",
    "together",
    "next",
    "white",
    "children",
    "begin",
    "got",
    "walk",
    "example",
    "ease",
    "paper",
    "group",
    "always",
    "music",
    "those",
    "both",
    "mark",
    "often",
    "letter",
    "until",
    "mile",
    "river",
    "car",
    "feet",
    "care",
    "second",
    "book",
    "carry",
    "took",
    "science",
    "eat",
    "room",
    "friend",
    "began",
    "idea",
    "fish",
    "mountain",
    "stop",
    "once",
    "base",
    "hear",
    "horse",
    "cut",
    "sure",
    "watch",
    "color",
    "face",
    "wood",
    "main",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "10",
    "100",
    "Hello",
    "Once",
    "upon",
    "Say",
    "something",
    "Count",
    "words",
    "Tell",
    "me",
    "The",
    "end",
    ".",
    ",",
    "!",
    "?",
    ":",
    ";",
]


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh directory next to ``out`` to write into; renamed to ``out`` (replacing it) when the block ends,
    removed when it raises, so a reader never sees a half-written ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def corpus(lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) for _ in range(lines)]


def build_tokenizer(vocab_size: int, seed: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(4000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL[3:],
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_model(
    out: Path,
    *,
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    max_positions: int,
    seed: int,
    model_type: str = "llama",
    extra: dict[str, object] | None = None,
) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_tokenizer(vocab, seed)
    torch.manual_seed(seed)
    fields: dict[str, object] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = AutoConfig.for_model(model_type, **{**fields, **(extra or {})})
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    with staged(out) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        params = sum(p.numel() for p in model.parameters())
        (staging / "SPEC.json").write_text(
            json.dumps(
                {
                    "model_type": model_type,
                    "config": extra or {},
                    "layers": layers,
                    "hidden": hidden,
                    "intermediate": intermediate,
                    "heads": heads,
                    "kv_heads": kv_heads,
                    "vocab": len(tokenizer),
                    "max_positions": max_positions,
                    "seed": seed,
                    "parameters": params,
                },
                indent=2,
            )
            + "\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--max-positions", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-type", default="llama", help="a Transformers model_type (llama, mixtral, ...)")
    parser.add_argument("--config", type=json.loads, default={}, help="JSON object of further config fields")
    a = parser.parse_args()
    write_model(
        a.out,
        layers=a.layers,
        hidden=a.hidden,
        intermediate=a.intermediate,
        heads=a.heads,
        kv_heads=a.kv_heads,
        vocab=a.vocab,
        max_positions=a.max_positions,
        seed=a.seed,
        model_type=a.model_type,
        extra=a.config,
    )


if __name__ == "__main__":
    main()
