"""The controller's scenarios with tenants on: the same checks against the same oracles must still pass when
the clients are split between three tenants (weights 3:1:2, clients round robin) queued by the gateway's fair
queue and its reserve. Tenants change who goes next, never how much the backend is given.
(``python -m bench.tenants --cases scenarios`` also runs two tenants 3:1: docs/tenants.md has both.)

Three scenarios miss a timing check (convergence into the oracle's band within its deadline) with these
tenants, on goodput above the check's: the fair order changes which requests run together, and these checks
flip on such changes. Without tenants they miss on other seeds too (over seeds 1-8: 8 of 24 runs without
tenants, 13 of 24 with these; docs/tenants.md has the figures). For them, every other check must pass and
those misses are reported as expected failures, not passes.
"""

from __future__ import annotations

import pytest

from testbed.scenarios.catalogue import SCENARIOS, by_name, run
from testbed.scenarios.harness import Tenancy, TenantSpec

TENANCY = Tenancy((TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0), TenantSpec("c", weight=2.0)))
#: Scenarios whose timing checks flip with the order of admission (see above).
ORDER_SENSITIVE = {"backend_slowdown", "backend_queue_noise", "whole_backend_slowdown"}
TIMING_CHECKS = ("did not converge",)


@pytest.mark.parametrize("name", [scenario.name for scenario in SCENARIOS])
def test_scenario_with_tenants(name: str) -> None:
    phases = run(by_name(name), tenancy=TENANCY)
    tolerated = name in ORDER_SENSITIVE
    failed, timing = [], []
    for r in phases:
        for failure in r.failures:
            line = f"{r.scenario}/{r.phase}: settled {r.settled}, goodput ratio {r.goodput_ratio}: {failure}"
            (timing if tolerated and failure.startswith(TIMING_CHECKS) else failed).append(line)
    assert not failed, "\n".join(failed)
    if timing:
        pytest.xfail("\n".join(timing))
