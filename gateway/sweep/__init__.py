"""``sweetspot sweep``: load generation and the concurrency sweep that measures a server and finds its sweet spot.

- :mod:`~gateway.sweep.driver`: :func:`run_sweep` with a :class:`SweepConfig` -> :class:`SweepResult`;
- :mod:`~gateway.sweep.result`: the result's schema and file format (which ``sweetspot serve`` reads to start
  at the sweet spot, so it needs pydantic only);
- :mod:`~gateway.sweep.loadgen`, :mod:`~gateway.sweep.client`, :mod:`~gateway.sweep.workload`: closed-loop and
  Poisson load whose concurrency can change while it runs, one :class:`RequestRecord` per request;
- :mod:`~gateway.sweep.stats`, :mod:`~gateway.sweep.finder`: the metric definitions and the pure finder;
- :mod:`~gateway.sweep.tables`, :mod:`~gateway.sweep.progress`, :mod:`~gateway.sweep.live`: what people read.
"""
