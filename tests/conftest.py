"""Shared fixtures: a factory that starts real processes and stops them after the test.

A SIGTERM to pytest (a CI job's timeout, ``kill``) would end it without tearing its fixtures down, and every
server the tests had started, in sessions of their own, would outlive it, still serving and polling. Taken
as a KeyboardInterrupt, it stops the run the way Ctrl-C does: pytest tears down every fixture, so the
factories stop what they started.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest

from gateway.common.processes import process_factory


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture
def processes():
    with process_factory() as start:
        yield start


@pytest.fixture(scope="module")
def module_processes():
    with process_factory() as start:
        yield start
