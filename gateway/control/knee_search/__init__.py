"""The default limit algorithm (:class:`~gateway.control.knee_search.aimd.Aimd`): a search for the knee of
the throughput curve with multiplicative decrease. It doubles the limit while each step pays (slow start),
then climbs by about a quarter at a time, reading the throughput at each limit off a curve pooled per
limit; when the last step's marginal throughput falls under a fraction of the average per slot it steps
back to the knee and holds there, re-probing now and then. Congestion (upstream errors, p99 TTFT or TPOT
over objective, KV-cache pressure, preemption, GPU memory) cuts the limit multiplicatively at once; a KV
cap from the cache's size bounds it from above. The parts: ``signals`` (congestion), ``meter`` and
``curve`` (throughput per limit), ``knee``, ``reprobe``, ``ceiling``, ``capacity`` (the KV cache), ``tpot``."""
