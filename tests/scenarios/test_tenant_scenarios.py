"""The controller's scenarios with tenants on: the same checks against the same oracles must still pass when
the clients are split between three tenants (weights 3:1:2, clients round robin) queued by the gateway's fair
queue and its reserve. Tenants change who goes next, never how much the backend is given.
(``python -m bench.tenants --cases scenarios`` also runs two tenants 3:1: docs/tenants.md has both.)"""

from __future__ import annotations

import pytest

from tests.support.scenarios.catalogue import SCENARIOS, by_name, run
from tests.support.scenarios.harness import Tenancy, TenantSpec

TENANCY = Tenancy((TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0), TenantSpec("c", weight=2.0)))


@pytest.mark.parametrize("name", [scenario.name for scenario in SCENARIOS])
def test_scenario_with_tenants(name: str) -> None:
    phases = run(by_name(name), tenancy=TENANCY)
    failed = [f"{r.scenario}/{r.phase}: settled {r.settled}, goodput ratio {r.goodput_ratio}: {'; '.join(r.failures)}"
              for r in phases if not r.ok]
    assert not failed, "\n".join(failed)
