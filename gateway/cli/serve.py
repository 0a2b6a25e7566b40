"""``sweetspot serve``: run the gateway under uvicorn.

Every setting is a flag, generated here from :class:`gateway.settings.Settings`, so nothing is written twice:
the field's name with dashes (``queue_timeout_s``: ``--queue-timeout-s``), its description as the help, its
section (:data:`gateway.settings.SECTIONS`) as the help panel. Booleans are ``--x/--no-x``, lists repeat
(``--upstream A --upstream B``), an optional setting takes ``none`` to unset it, and a structured one (the
tenants) takes JSON, as its ``SWEETSPOT_*`` variable does. A flag not given stays ``None`` here, and
:func:`gateway.settings.load_settings` then leaves that setting to the environment, the TOML file or the default.
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic.fields import FieldInfo

from gateway.cli import app
from gateway.settings import SECTIONS, UNSET, Settings

#: Flag names that predate the generated ones, kept working beside them (scripts, tests and docs use them).
ALIASES: dict[str, tuple[str, ...]] = {
    "upstreams": ("--upstream", "-u"),
    "control_enabled": ("--control/--no-control",),
}
#: The panel of a field declared outside every section; a unit test keeps it empty.
UNSECTIONED = "Other settings"
#: What an optional setting's flag takes to unset it (None over env and TOML).
NONE_WORD = "none"

_SCALARS: tuple[type, ...] = (str, int, float, Path)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return f"{Settings.model_config.get('env_prefix', '')}{field_name}".upper()


def _default_text(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) if value else "none"
    return str(value)


def _or_none(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return UNSET if text == NONE_WORD else convert(text)

    return parse


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}") from None


def _option(name: str, field: FieldInfo, panel: str) -> inspect.Parameter:
    """The typer option of one setting: its type, flag names, help and panel, from the field alone."""
    annotation = field.annotation
    args = get_args(annotation)
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in args
    base = next(arg for arg in args if arg is not type(None)) if optional else annotation
    flag = flag_name(name)
    extra: dict[str, Any] = {}
    notes: list[str] = []
    if base is bool:
        kind: Any = bool
        declared = [f"{flag}/--no-{flag[2:]}"]
    elif get_origin(base) is list and get_args(base)[0] in _SCALARS:
        kind, declared = base, [flag]
        notes.append("Repeat the flag for each item.")
    elif get_origin(base) is Literal:
        kind, declared = base, [flag]
    elif base in _SCALARS:
        kind, declared = base, [flag]
        if optional:
            extra = {"parser": _or_none(base), "metavar": f"<{base.__name__.lower()}|{NONE_WORD}>"}
            notes.append(f"'{NONE_WORD}' unsets it.")
    else:  # a structure (the tenants): JSON, as in its environment variable
        kind, declared = str, [flag]
        extra = {"parser": _json, "metavar": "<json>"}
        notes.append(f"A JSON value, as in {env_name(name)}.")
    help_text = " ".join(
        [field.description or "", *notes, f"[default: {_default_text(field)}]", f"[env: {env_name(name)}]"]
    )
    if app.rich_markup_mode == "rich":  # the help is rich markup there: `[env: X]` or `[share]` would be tags
        from rich.markup import escape

        help_text = escape(help_text)
    option = typer.Option(*declared, *ALIASES.get(name, ()), help=help_text, rich_help_panel=panel, **extra)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option]
    )


def _parameters() -> list[inspect.Parameter]:
    """``--config`` and then one option per setting, section by section."""
    config_help = f"TOML settings file, the lowest source above the defaults. [env: {env_name('config')}]"
    if app.rich_markup_mode == "rich":
        from rich.markup import escape

        config_help = escape(config_help)
    config = typer.Option("--config", "-c", help=config_help)
    parameters = [
        inspect.Parameter(
            "config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[Path | None, config]
        )
    ]
    placed: set[str] = set()
    for title, section in SECTIONS.items():
        for name in section.model_fields:
            parameters.append(_option(name, Settings.model_fields[name], title))
            placed.add(name)
    for name, field in Settings.model_fields.items():
        if name not in placed:
            parameters.append(_option(name, field, UNSECTIONED))
    return parameters


def serve(**values: Any) -> None:
    """Run the gateway. Every setting is a flag; a flag given overrides its SWEETSPOT_* environment variable,
    which overrides the TOML file (--config), which overrides the default."""
    from pydantic import ValidationError

    from gateway.server.process.launch import run

    config = values.pop("config")
    try:
        run(config=config, **values)
    except (ValueError, FileNotFoundError) as exc:
        # Bad settings from any source (ValidationError and SweepResultError are ValueErrors) end here,
        # with the reason and without a traceback.
        message = str(exc) if not isinstance(exc, ValidationError) else _describe(exc)
        typer.echo(f"sweetspot serve: {message}", err=True)
        raise typer.Exit(2) from None


# typer reads a command's options from its signature: this one is generated, one keyword per setting.
serve.__signature__ = inspect.Signature(_parameters())  # type: ignore[attr-defined]
app.command("serve")(serve)


def _describe(exc: Any) -> str:
    parts = [f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()]
    return "invalid settings: " + "; ".join(parts)
