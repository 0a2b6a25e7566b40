"""Model aliases and the default model: the settings' checks, and how the pool resolves a client's name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.control.window import SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.upstream.pool import OTHER_MODELS, Upstream, UpstreamPool
from gateway.settings import Settings, alias_targets, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SWEETSPOT_"):
            monkeypatch.delenv(key)


def upstream(url: str, *models: str, any_name: bool = False) -> Upstream:
    listed: list[dict[str, Any]] = [{"id": model, "object": "model"} for model in models]
    return Upstream(url, Limiter(url, 4), SlidingWindow(30.0), models=listed, any_name=any_name)


def test_an_alias_may_name_another_alias_and_resolves_to_the_served_name() -> None:
    assert alias_targets({"a": "b", "b": "c", "d": "c"}) == {"a": "c", "b": "c", "d": "c"}


@pytest.mark.parametrize(
    ("aliases", "cycle"),
    [
        ({"a": "a"}, "a -> a"),
        ({"a": "b", "b": "a"}, "a -> b -> a"),
        ({"x": "a", "a": "b", "b": "a"}, "x -> a -> b -> a"),
    ],
)
def test_a_cycle_of_aliases_is_refused_in_one_line(aliases: dict[str, str], cycle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(model_aliases=aliases)
    assert f"model_aliases: a cycle of aliases: {cycle}" in str(caught.value)


def test_empty_names_are_refused() -> None:
    with pytest.raises(ValidationError, match="must not be empty"):
        Settings(model_aliases={"": "m"})
    with pytest.raises(ValidationError, match="default_model must not be empty"):
        Settings(default_model=" ")


def test_aliases_come_from_env_as_json_and_from_toml_as_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sweetspot.toml"
    config.write_text('default_model = "qwen"\n[model_aliases]\n"gpt-4o-mini" = "qwen"\n')
    settings = load_settings(config)
    assert settings.model_aliases == {"gpt-4o-mini": "qwen"} and settings.default_model == "qwen"
    # A higher source's aliases add to a lower one's, name by name (pydantic-settings merges tables).
    monkeypatch.setenv("SWEETSPOT_MODEL_ALIASES", '{"gpt-4o": "llama", "gpt-4o-mini": "llama"}')
    assert load_settings(config).model_aliases == {"gpt-4o-mini": "llama", "gpt-4o": "llama"}


def test_the_pool_resolves_aliases_then_listed_names_then_the_default() -> None:
    pool = UpstreamPool(
        [upstream("http://a", "m"), upstream("http://b", "n")], aliases={"x": "y", "y": "m"}, default_model="y"
    )
    assert pool.resolve("x") == ("m", ["http://a"], "m")
    assert pool.resolve("n") == ("n", ["http://b"], "n")  # listed: its own, whatever the default
    assert pool.resolve("unknown") == ("m", ["http://a"], "m")  # the default, itself an alias of m


def test_without_a_default_only_an_any_name_upstream_takes_an_unlisted_name() -> None:
    plain = UpstreamPool([upstream("http://a", "m")])
    assert plain.resolve("unknown") == ("unknown", [], OTHER_MODELS)
    pool = UpstreamPool([upstream("http://a", "m"), upstream("http://l", "model.gguf", any_name=True)])
    assert pool.resolve("unknown") == ("unknown", ["http://l"], "model.gguf")
    assert pool.resolve("m") == ("m", ["http://a"], "m")  # a listed name is not sent to the any-name upstream
    router = UpstreamPool([upstream("http://l", "a.gguf", "b.gguf", any_name=True)])  # llama-server's router mode
    assert router.resolve("unknown").eligible == []
    replicas = UpstreamPool(
        [upstream("http://l1", "m.gguf", any_name=True), upstream("http://l2", "m.gguf", any_name=True)]
    )
    assert replicas.resolve("gpt-4o-mini") == ("gpt-4o-mini", ["http://l1", "http://l2"], "m.gguf")
    # A chat model on one llama-server and an embedding model on another: which did the client mean? Nobody's.
    mixed = UpstreamPool(
        [upstream("http://l", "chat.gguf", any_name=True), upstream("http://e", "embed.gguf", any_name=True)]
    )
    assert mixed.resolve("gpt-4o-mini") == ("gpt-4o-mini", [], OTHER_MODELS)


def test_a_served_name_no_upstream_lists_is_a_warning_that_says_it_may_appear_later() -> None:
    pool = UpstreamPool([upstream("http://a", "m")], aliases={"x": "m", "y": "lora-1"}, default_model="base")
    assert pool.unlisted_targets() == [
        "model_aliases: 'y' names 'lora-1', which no upstream lists now; requests for it get 404 until one does "
        "(a model loaded later, or an upstream that answers any name, such as llama-server)",
        "default_model names 'base', which no upstream lists now; requests for it get 404 until one does "
        "(a model loaded later, or an upstream that answers any name, such as llama-server)",
    ]


def test_models_lists_an_alias_beside_the_served_models() -> None:
    pool = UpstreamPool([upstream("http://a", "m")], aliases={"x": "m", "y": "gone"})
    assert pool.all_models() == [
        {"id": "m", "object": "model"},
        {"id": "x", "object": "model", "created": 0, "owned_by": "alias of m", "root": "m"},
    ]
