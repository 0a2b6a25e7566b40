"""``sweetspot demo``: the whole idea in two minutes, against the built-in simulator.

The simulator and the gateway run as child processes (:mod:`~gateway.common.processes`); the script of
load phases and the scaled time constants are data (:mod:`~gateway.demo.script`); each phase's reference
sweet spot comes from the sweep (:mod:`~gateway.demo.reference`); samples of the gateway's and the
backend's state form a timeline (:mod:`~gateway.demo.timeline`), shown live (:mod:`~gateway.demo.view`)
and summarised per phase (:mod:`~gateway.demo.summary`, :mod:`~gateway.demo.outcome`,
:mod:`~gateway.demo.plot`). :func:`gateway.demo.run.run_demo` runs it all. The ``--elastic`` variant, a second
simulator joining the running gateway, is set up and reported by :mod:`~gateway.demo.joining` and summarised
by :mod:`~gateway.demo.elastic`.
"""
