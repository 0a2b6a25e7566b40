"""gateway/common/processes.py: a process that never prints its ready line fails the start with its output,
instead of hanging (reading the output for the error re-enters the lock the wait holds)."""

from __future__ import annotations

import sys

import pytest

from gateway.common.processes import ProcessError, start_process


def test_a_process_that_never_gets_ready_fails_with_its_output() -> None:
    script = "print('starting', flush=True); import time; time.sleep(30)"
    with pytest.raises(ProcessError, match=r"printed no line matching 'never' within 1s(.|\n)*starting"):
        start_process([sys.executable, "-c", script], ready_pattern="never", timeout=1)
