"""The pure controller: observations in, decision out, clock injected. This package holds the interface
(``algorithm``: ``LimitAlgorithm.step(observation) -> Decision``), the sliding window of samples, the
observation built from it, the knobs, and one upstream's controller as the server runs it; the default
algorithm, a knee search, is in ``knee_search/``, and the alternatives users could pick instead are in
``baselines/`` (the ``algorithm`` setting's built-in names). Nothing here does I/O, waits or reads a clock."""
