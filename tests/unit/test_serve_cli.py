"""`sweetspot serve`: every setting is a flag, generated from the settings (name, help, section, env name), and
bad configuration ends at start-up with one clear line, not a traceback.

The in-process tests go through typer's real option parsing (CliRunner on the ``sweetspot`` app) with the
server's ``run`` replaced by :func:`gateway.settings.load_settings`, so no server starts; the subprocess tests
run the installed command as a user does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from gateway.cli import _register, app
from gateway.cli.serve import ALIASES, UNSECTIONED, env_name, flag_name
from gateway.common.processes import sweetspot
from gateway.control.config import ControllerKnobs
from gateway.settings import SECTIONS, Settings, load_settings

_register()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SWEETSPOT_"):
            monkeypatch.delenv(key)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch):
    """Invoke ``sweetspot serve ARGS`` in process; returns (result, the settings it would have served with)."""
    from gateway.server.process import launch

    seen: list[Settings] = []

    def fake_run(config: Path | None = None, **flags: Any) -> None:
        seen.append(load_settings(config, **flags))

    monkeypatch.setattr(launch, "run", fake_run)

    def invoke(*args: str, env: dict[str, str] | None = None):
        seen.clear()
        result = CliRunner().invoke(app, ["serve", *args], env=env)
        return result, (seen[0] if seen else None)

    return invoke


def serve_options() -> dict[str, Any]:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return {param.name: param for param in command.params}


# --- every setting is a flag -------------------------------------------------------------------------------


def test_every_setting_has_a_flag_named_after_it() -> None:
    """Generated over the fields: a new setting without a flag (or with a misnamed one) fails here."""
    options = serve_options()
    assert set(options) - {"help"} == {*Settings.model_fields, "config"}
    for name, field in Settings.model_fields.items():
        option = options[name]
        assert flag_name(name) in option.opts, name
        if field.annotation is bool:
            assert f"--no-{flag_name(name)[2:]}" in option.secondary_opts, name
        assert option.default is None, f"{name}: a flag not given must not override env or TOML"
        assert field.description and field.description.split(".")[0] in option.help.replace("\\", ""), name
        assert f"[env: {env_name(name)}]" in option.help.replace("\\", ""), name


def test_every_setting_is_in_one_section_and_its_panel() -> None:
    placed = [name for section in SECTIONS.values() for name in section.model_fields]
    assert sorted(placed) == sorted(Settings.model_fields), "each setting is declared in exactly one section"
    assert SECTIONS["Controller: limits, objectives, the knee search"] is ControllerKnobs
    options = serve_options()
    for title, section in SECTIONS.items():
        for name in section.model_fields:
            assert options[name].rich_help_panel == title
    assert all(option.rich_help_panel != UNSECTIONED for option in options.values())


def test_the_flags_that_predate_the_generated_ones_still_parse(serve, tmp_path: Path) -> None:
    """The names scripts, tests, bench and docs use (grep for `sweetspot serve` / `gateway serve`)."""
    config = tmp_path / "c.toml"
    config.write_text("max_n = 3\n")
    sweep = tmp_path / "sweep.json"
    result, settings = serve(
        *("-u", "http://a:1/", "--upstream", "http://b:2", "--host", "0.0.0.0", "--port", "0", "--workers", "2"),
        *("-c", str(config), "--backend", "vllm", "--initial-limit", "5", "--max-queue", "0"),
        *("--queue-timeout-s", "0.3", "--routing", "random", "--no-control", "--sweep-result", str(sweep)),
        *("--log-level", "warning"),
    )
    assert result.exit_code == 0, result.output
    assert settings is not None
    assert settings.upstreams == ["http://a:1", "http://b:2"]
    assert (settings.host, settings.port, settings.workers, settings.backend) == ("0.0.0.0", 0, 2, "vllm")
    assert (settings.initial_limit, settings.max_queue, settings.queue_timeout_s) == (5, 0, 0.3)
    assert (settings.routing, settings.control_enabled, settings.log_level) == ("random", False, "warning")
    assert settings.sweep_result == sweep and settings.max_n == 3
    result, settings = serve("--config", str(config), "--control", "--algorithm", "mypkg.limits:MyLimit")
    assert result.exit_code == 0, result.output
    assert settings is not None and settings.control_enabled and settings.algorithm == "mypkg.limits:MyLimit"
    assert set(ALIASES) <= set(Settings.model_fields)


def test_flags_of_each_kind_reach_the_settings_typed(serve) -> None:
    result, settings = serve(
        *("--port", "9000", "--queue-timeout-s", "1.5", "--no-access-log", "--control-enabled"),
        *("--gpus", "0", "--gpus", "2", "--api-keys", "k1", "--api-keys", "k2", "--upstreams", "http://a:1"),
        *("--ttft-p99-slo-s", "none", "--tpot-p99-slo-s", "0.25", "--backend-max-seqs", "64"),
        *("--queue-discipline", "fifo", "--log-format", "text", "--admin-api-key", "secret"),
    )
    assert result.exit_code == 0, result.output
    assert settings is not None
    assert settings.port == 9000 and type(settings.port) is int
    assert settings.queue_timeout_s == 1.5 and type(settings.queue_timeout_s) is float
    assert settings.access_log is False and settings.control_enabled is True
    assert settings.gpus == [0, 2] and settings.api_keys == ["k1", "k2"] and settings.upstreams == ["http://a:1"]
    assert settings.ttft_p99_slo_s is None and settings.tpot_p99_slo_s == 0.25 and settings.backend_max_seqs == 64
    assert (settings.queue_discipline, settings.log_format, settings.admin_api_key) == ("fifo", "text", "secret")


def test_tenants_as_json(serve) -> None:
    tenants = [{"name": "a", "api_keys": ["ka"], "weight": 2}, {"name": "b", "api_keys": ["kb"]}]
    classes = ("--priority-classes", "hi", "--priority-classes", "lo", "--default-priority", "lo")
    result, settings = serve("--tenants", json.dumps(tenants), *classes)
    assert result.exit_code == 0, result.output
    assert settings is not None
    assert [(t.name, t.weight) for t in settings.tenants] == [("a", 2.0), ("b", 1.0)]
    assert settings.priority_classes == ["hi", "lo"]
    result, _ = serve("--tenants", "[{")
    assert result.exit_code == 2 and "--tenants" in result.output and "Traceback" not in result.output


def test_flags_over_env_over_toml(serve, tmp_path: Path) -> None:
    config = tmp_path / "sweetspot.toml"
    config.write_text(
        'upstreams = ["http://a:8000/"]\nmax_queue = 10\nport = 9000\ninitial_limit = 3\n'
        'routing = "random"\ncontrol_enabled = false\nadmin_api_key = "from-toml"\ngpus = [1]\n'
    )
    env = {"SWEETSPOT_MAX_QUEUE": "20", "SWEETSPOT_PORT": "9100", "SWEETSPOT_TTFT_P99_SLO_S": "3"}
    result, settings = serve("-c", str(config), "--port", "9200", "--ttft-p99-slo-s", "none", env=env)
    assert result.exit_code == 0, result.output
    assert settings is not None
    assert settings.port == 9200  # flag over env over TOML
    assert settings.max_queue == 20  # env over TOML
    assert settings.initial_limit == 3 and settings.routing == "random" and settings.gpus == [1]  # TOML, no flag
    assert settings.control_enabled is False  # a boolean flag not given does not override
    assert settings.ttft_p99_slo_s is None  # `none` unsets, over env
    result, settings = serve("-c", str(config), "--admin-api-key", "none", "--control", "--gpus", "0")
    assert settings is not None and settings.admin_api_key is None and settings.control_enabled is True
    assert settings.gpus == [0]  # a list flag replaces the list
    result, settings = serve(env={"SWEETSPOT_CONFIG": str(config), "SWEETSPOT_ROUTING": "least_loaded"})
    assert settings is not None and settings.routing == "least_loaded" and settings.max_queue == 10


def test_help_lists_the_flags_by_section_with_their_env_names(serve) -> None:
    result, settings = serve("--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0 and settings is None
    for title in SECTIONS:
        assert title in result.output
    for name in ("queue_timeout_s", "upstreams", "limit_min", "tenants", "share_redis_url"):
        assert env_name(name) in result.output and flag_name(name) in result.output
    assert "--no-control" in result.output and "--upstream" in result.output and "SWEETSPOT_CONFIG" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--port", "70000"), "invalid settings: port"),
        (("--limit-min", "9", "--limit-max", "3"), "limit_min (9) exceeds limit_max (3)"),
        (("--no-control", "--algorithm", "mypkg.limits:MyLimit"), "needs the control loop"),
        (("--share-ttl-s", "0"), "invalid settings: share_ttl_s"),
        (("--model-aliases", '{"a": "b", "b": "a"}'), "model_aliases: a cycle of aliases: a -> b -> a"),
    ],
)
def test_a_value_the_settings_refuse_is_one_line_and_exit_2(serve, args, expected) -> None:
    result, _ = serve(*args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("sweetspot serve: ")
    assert expected in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [(("--port", "eighty"), "--port"), (("--log-level", "loud"), "--log-level"), (("--kv-capacity-tokens", "x"), "")],
)
def test_a_value_of_the_wrong_type_is_a_usage_error(serve, args, flag) -> None:
    result, settings = serve(*args)
    assert result.exit_code == 2 and settings is None
    assert "Traceback" not in result.output and flag in result.output


# --- the installed command, as a user runs it -----------------------------------------------------------------


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWEETSPOT_")}
    return subprocess.run(
        sweetspot("serve", *args), capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), None, "no upstream configured"),
        (("-u", "http://127.0.0.1:9", "--config", "/nonexistent.toml"), None, "config file not found"),
        (("-u", "http://127.0.0.1:9"), {"SWEETSPOT_PORT": "eighty"}, "invalid settings: port"),
        (("-u", "http://127.0.0.1:9"), {"SWEETSPOT_LIMIT_MIN": "9", "SWEETSPOT_LIMIT_MAX": "3"}, "limit_min"),
        (("-u", "http://127.0.0.1:9", "--limit-min", "9", "--limit-max", "3"), None, "limit_min"),
    ],
)
def test_bad_settings_exit_2_with_the_reason(args, env, expected) -> None:
    result = run_serve(*args, env=env)
    assert result.returncode == 2
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_file_that_is_no_sweep_result(tmp_path: Path) -> None:
    bogus = tmp_path / "sweep.json"
    bogus.write_text("{}")
    result = run_serve("-u", "http://127.0.0.1:9", "--sweep-result", str(bogus))
    assert result.returncode == 2 and "not a sweetspot sweep result" in result.stderr
