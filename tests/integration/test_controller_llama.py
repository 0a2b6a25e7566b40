"""The controller in the running gateway, in front of a real llama-server, against static limits measured in the
same test: under a closed-loop load of four times the server's slots it must settle at or below the slot count
and deliver at least 0.9 x the throughput of the best static limit.

How it stays honest on a small shared machine:

* llama-server runs one thread: with two ggml threads on two shared cores, any other process stalls its
  thread barrier and throughput swings by tens of percent; one thread leaves the other core to the gateways
  and the load generator, and the curve keeps its knee at the slot count (batching is what pays on a CPU).
* One gateway per configuration (the controller with its default settings, and ``--no-control --initial-limit
  K`` for K in 2, 4 and 8), all in front of the same server, measured one at a time in short runs whose order
  rotates each round. The controller is compared with each static limit round by round (its run against
  that limit's run of the same round, seconds apart), and the median of those ratios must reach 0.9 for
  every static limit, unless the controller held exactly that limit through every measured run: then it was
  that configuration, and the ratio is the machine's noise (one CI run: 0.887 at a constant limit of 4).
  The medians of whole columns are printed too, but they are not what is compared: the
  machine's other work drifts over a test, and then they compare one configuration's early runs with
  another's late ones (one run here: the controller's median 0.85 of static 8's, while round by round it
  ran 0.94-0.96 of it in all but the round with its exploratory probe).
* K = 8 is above the slots: while it runs, llama-server queues requests itself, and the controller's gateway,
  idle at that moment, sees that queue. It is not the controller's own: its ``backend_queue_persist_s`` clock
  starts only once the controller's gateway runs or queues something again (docs/controller.md, "Somebody
  else's load"), and at its default of 6 s it outlasts a static run (3.5 s of load), which is why that setting is
  not among the faster ones below.
* The controller starts where a user's gateway starts (``initial_limit`` 8, cut to the 4 slots as soon as
  ``/props`` is read). This server's curve is convex at the bottom: measured direct, 149, 155, 192 and 270
  tokens/s at 1, 2, 3 and 4 streams (medians of 4 runs), so two slots are worth little more than one and
  the fourth slot is worth the most.
* Seven rounds, not three: with other work on the same two cores, single runs of any configuration fall
  20-40% short now and then, and one of the controller's measured runs usually holds a probe (below), so
  with three rounds the comparison came down to two runs (with five, one run in seven still failed, at
  0.896 against static 8, while holding the slots all along).
* The bar is never loosened: a failure prints every run.

Faster controller settings (``FAST_CONTROL``, in ``testbed/closed_loop.py``) let it converge within the
test: a tick every 0.5 s instead of 2 s, 1 s to settle and 2 s per throughput reading instead of 2 s and 6 s
(this server's tokens arrive at a steady few hundred per second, so 2 s readings hold a few hundred tokens),
a 5 s window, a re-probe every 10 s of busy time instead of 30 s (so the cost of probing shows in the
measurement instead of falling after it; a probe holds for a settle and two readings, 5 s in every 10 here
against 14 s in every 30 by default), and the backend's /metrics scraped every 0.5 s (the slot count, its
hard cap, is known at once).

What probing costs here, and what is measured of it: at the hard cap nothing lies above, so the only question
is whether the knee lies below. With only the cap measured, the controller steps down one slot to find out (an
exploratory probe, once it holds three readings at the cap: about 9-10 s in), and a probe holds for a settle
and two readings. That exploration is part of converging, so the convergence runs until it is answered (the
limit back at the slots with a settled reading below them on the curve; ``CONVERGE_MAX_S`` at most). Measured
runs of 3.5 s of demand would otherwise catch it half-done: a run at one slot less (a quarter of its
throughput lost), and, the attempt abandoned when the run ends, another in a later run. After a clear answer
the next down-probe at the cap waits twice the re-probe period of busy time (see
``gateway/control/knee_search/reprobe.py``), 20 s here, so one probe still falls among the measured runs, as
in production; it is abandoned when its run's demand ends, and the wait doubles again.
"""

from __future__ import annotations

from functools import partial

import pytest

from gateway.sweep.workload import Workload, parse_length
from testbed.closed_loop import explored_below, limit_of, rotated_rounds, start_configurations, stream_load
from testbed.llama import MODEL, llama_config, start_llama_server

SLOTS = 4
CLIENTS = 4 * SLOTS
STATIC_LIMITS = (2, 4, 8)  # below, at and above the slot count
ROUNDS = 7
WARMUP_S = 1.0  # per run: the queue fills and the first prefills pass
MEASURE_S = 2.5
CONVERGE_MAX_S = 30.0  # until the exploration at the cap is answered (above), at most this
WORKLOAD = Workload(api="completions", prompt_len=parse_length(16), output_len=parse_length(64))


@pytest.fixture(scope="module")
def gateways(module_processes) -> dict[str, str]:
    llama = start_llama_server(module_processes, llama_config(parallel=SLOTS, threads=1)).url
    return start_configurations(module_processes, llama, STATIC_LIMITS)


async def test_controller_settles_at_the_slots_with_the_best_static_throughput(gateways) -> None:
    controller = gateways["controller"]
    load = partial(stream_load, model=MODEL, workload=WORKLOAD, clients=CLIENTS)
    limits: list[int] = []
    # Converge: from the default initial limit, under a load of 4x the slots, until the exploration is answered.
    await load(
        controller,
        seconds=CONVERGE_MAX_S,
        warmup_s=0.0,
        on_tick=lambda: limits.append(limit_of(controller)),
        until=lambda: explored_below(controller, SLOTS),
    )
    converged_at = limit_of(controller)
    explored = explored_below(controller, SLOTS)
    settled: list[int] = []

    async def run(name: str) -> float:
        watch = (lambda: settled.append(limit_of(controller))) if name == "controller" else None
        return (await load(gateways[name], seconds=MEASURE_S, warmup_s=WARMUP_S, on_tick=watch)).tokens_per_s

    comparison = await rotated_rounds(list(gateways), ROUNDS, run)
    report = (
        f"limit while converging {limits}, at the end {converged_at} (exploration answered: {explored}), "
        f"while measured {settled}; {comparison.report()}"
    )
    print(report)

    assert settled and max(settled) <= SLOTS, report
    assert converged_at <= SLOTS, report
    assert comparison.holds_the_best_static(settled), report
