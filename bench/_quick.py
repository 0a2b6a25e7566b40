"""``--quick``: a bench's smoke run, every figure in seconds (tests/integration/test_bench_smoke.py runs them).

Each bench declares what ``--quick`` changes as a dict of argparse destinations; options given on the command
line still win, so ``--quick --seconds 3`` is the quick run with 3-second phases. The figures of a quick run
say nothing (too short, too few clients): it checks that the bench runs to its end and reports them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any


def add_quick(parser: argparse.ArgumentParser, quick: Mapping[str, Any]) -> None:
    """Add ``--quick`` to ``parser``; :func:`parse` applies ``quick`` as defaults when it is given."""
    shown = ", ".join(_option(dest, value) for dest, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"a smoke run, in seconds: {shown} (options given win)")
    parser.set_defaults(_quick=dict(quick))


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with the ``--quick`` defaults of :func:`add_quick` when it is given."""
    known, _ = parser.parse_known_args(argv)
    if known.quick:
        parser.set_defaults(**known._quick)
    args = parser.parse_args(argv)
    del args._quick
    return args


def _option(dest: str, value: Any) -> str:
    flag = "--" + dest.replace("_", "-")
    if value is True:
        return flag
    if value is False:
        return "--no-" + dest.replace("_", "-")
    if isinstance(value, list | tuple):
        return f"{flag} {' '.join(str(v) for v in value)}"
    return f"{flag} {value}"
