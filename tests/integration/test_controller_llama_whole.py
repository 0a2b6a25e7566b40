"""The controller in the running gateway, in front of a real llama-server, when nobody streams: closed-loop
clients at three times the knee (the server's 4 slots) ask for whole answers, and the controller must deliver
at least 0.9 x the throughput of the best static limit measured in the same test (or hold exactly that limit
through every measured run, when the ratio measures only the machine's noise).

A whole answer shows its tokens to the gateway only when it ends, and llama-server's own token counter moves
only then too, so the controller meters them itself: each answer's tokens spread over its life, a reading final
once every request that ran in it has ended (``gateway/control/accounting.py``, ``meter.py``). Without that, a
reading holds whichever answers happened to end in it.

The method is ``test_controller_llama.py``'s (read its notes): one gateway per configuration in front of the
same one-thread server, short runs in an order that rotates each round, the controller compared with each
static limit round by round, the median of those ratios. What differs is how a run is measured: the client
side has the same problem as the controller, so a run counts each answer's tokens spread evenly over its life
(from sending to its end) inside the measured interval, and lets the answers still in flight at the end finish
to know their counts. Spread that way over any interval of a steady load, the count is unbiased. As there,
the convergence runs until the controller's exploration below the slots is answered.
"""

from __future__ import annotations

from functools import partial

import pytest

from gateway.sweep.workload import Workload, parse_length
from testbed.closed_loop import explored_below, rotated_rounds, start_configurations, upstream_state, whole_load
from testbed.llama import MODEL, llama_config, start_llama_server

SLOTS = 4
CLIENTS = 3 * SLOTS
STATIC_LIMITS = (2, 4, 8)  # below, at and above the slot count
ROUNDS = 7
WARMUP_S = 1.0
MEASURE_S = 3.0
CONVERGE_MAX_S = 30.0  # until the exploration at the cap is answered (test_controller_llama.py), at most this
WORKLOAD = Workload(api="completions", prompt_len=parse_length(16), output_len=parse_length(64))


@pytest.fixture(scope="module")
def gateways(module_processes) -> dict[str, str]:
    llama = start_llama_server(module_processes, llama_config(parallel=SLOTS, threads=1)).url
    return start_configurations(module_processes, llama, STATIC_LIMITS)


async def test_controller_holds_whole_answers_at_the_best_static_throughput(gateways) -> None:
    controller = gateways["controller"]
    load = partial(whole_load, model=MODEL, workload=WORKLOAD, clients=CLIENTS)
    limits: list[int] = []

    def watch() -> None:
        limits.append(int(upstream_state(controller)["limit"]))

    await load(
        controller, seconds=CONVERGE_MAX_S, warmup_s=0.0, on_tick=watch, until=lambda: explored_below(controller, SLOTS)
    )
    explored = explored_below(controller, SLOTS)
    state = upstream_state(controller)
    converged_at = int(state["limit"])
    algorithm = state["controller"]["algorithm"]
    settled: list[int] = []

    async def run(name: str) -> float:
        watch_settled = (
            (lambda: settled.append(int(upstream_state(controller)["limit"]))) if name == "controller" else None
        )
        return (await load(gateways[name], seconds=MEASURE_S, warmup_s=WARMUP_S, on_tick=watch_settled)).tokens_per_s

    comparison = await rotated_rounds(list(gateways), ROUNDS, run)
    curve = upstream_state(controller)["controller"]["algorithm"]["curve"]
    report = (
        f"limit while converging {limits}, at the end {converged_at} (exploration answered: {explored}; metered by "
        f"{algorithm['tokens_source']}), while measured {settled}; curve {curve}; {comparison.report()}"
    )
    print(report)

    assert algorithm["tokens_source"] == "gateway", report  # llama-server's counter moves only as requests end
    assert algorithm["exact_throughput"], report
    assert comparison.holds_the_best_static(settled), report
