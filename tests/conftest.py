"""Shared fixtures: a factory that starts real processes and stops them after the test."""

from __future__ import annotations

import pytest

from gateway.demo.processes import process_factory


@pytest.fixture
def processes():
    with process_factory() as start:
        yield start


@pytest.fixture(scope="module")
def module_processes():
    with process_factory() as start:
        yield start
