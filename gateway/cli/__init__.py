"""The ``sweetspot`` command. Each sub-command lives in its own module and only handles arguments;
the work is done by the package it calls into (``gateway.server.app``, ``gateway.sim``, ``gateway.sweep``,
``gateway.plan``)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="sweetspot",
    help="Adaptive concurrency gateway for LLM inference servers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Adaptive concurrency gateway for LLM inference servers."""
    # A callback keeps typer in multi-command mode whatever modules are registered.


def _register() -> None:
    """Import the sub-command modules; each one adds itself to ``app``."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


#: Packages only the tools need (the ``sim``, ``sweep``, ``plan`` and ``demo`` extras).
TOOL_PACKAGES = frozenset({"numpy", "rich", "matplotlib", "gguf"})


def main() -> None:
    _register()
    try:
        app()
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in TOOL_PACKAGES:
            raise
        typer.echo(
            f"this command needs {exc.name}, which the base install leaves out: pip install 'sweetspot-gateway[tools]'",
            err=True,
        )
        raise SystemExit(2) from None
