"""Settings: flags over env over TOML over defaults, one class, SWEETSPOT_* names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("SWEETSPOT_"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    settings = Settings()
    assert settings.port == 8080 and settings.upstreams == [] and settings.control_enabled


def test_precedence_flags_env_toml(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "sweetspot.toml"
    config.write_text('upstreams = ["http://a:8000/"]\nmax_queue = 10\nport = 9000\ninitial_limit = 3\n')
    monkeypatch.setenv("SWEETSPOT_MAX_QUEUE", "20")
    monkeypatch.setenv("SWEETSPOT_PORT", "9100")
    settings = load_settings(config, port=9200, initial_limit=None)
    assert settings.upstreams == ["http://a:8000"]  # from TOML, trailing slash dropped
    assert settings.max_queue == 20  # env beats TOML
    assert settings.port == 9200  # flag beats env
    assert settings.initial_limit == 3  # a flag left unset (None) does not override


def test_lists_from_env_as_csv_or_json(monkeypatch) -> None:
    monkeypatch.setenv("SWEETSPOT_UPSTREAMS", "http://a:1, http://b:2")
    monkeypatch.setenv("SWEETSPOT_API_KEYS", '["k1", "k2"]')
    monkeypatch.setenv("SWEETSPOT_GPUS", "0,2")
    settings = Settings()
    assert settings.upstreams == ["http://a:1", "http://b:2"]
    assert settings.api_keys == ["k1", "k2"]
    assert settings.gpus == [0, 2]


def test_config_file_from_env(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text("queue_timeout_s = 1.5\n")
    monkeypatch.setenv("SWEETSPOT_CONFIG", str(config))
    assert load_settings().queue_timeout_s == 1.5


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "bad", [{"limit_min": 10, "limit_max": 5}, {"port": 70000}, {"max_queue": -1}, {"backend": "tgi"}]
)
def test_invalid_values_are_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)


def test_unset_flag_sets_none_over_env_and_toml(tmp_path: Path, monkeypatch) -> None:
    """None among the flags means "not given"; UNSET (a flag's `none`) sets an optional setting to None."""
    from gateway.settings import UNSET

    config = tmp_path / "c.toml"
    config.write_text('admin_api_key = "k"\n')
    monkeypatch.setenv("SWEETSPOT_TTFT_P99_SLO_S", "3")
    kept = load_settings(config, admin_api_key=None, ttft_p99_slo_s=None)
    assert kept.admin_api_key == "k" and kept.ttft_p99_slo_s == 3.0
    unset = load_settings(config, admin_api_key=UNSET, ttft_p99_slo_s=UNSET)
    assert unset.admin_api_key is None and unset.ttft_p99_slo_s is None
