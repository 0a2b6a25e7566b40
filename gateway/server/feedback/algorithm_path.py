"""The ``algorithm`` setting: another limit algorithm in the controller's place, by a built-in name or an
import path.

A built-in name (``static``, ``gie-threshold``, ``envoy-gradient``, ``netflix-gradient2``, ``netflix-vegas``,
``netflix-aimd``: ``gateway.control.baselines.BUILT_IN``) builds one of the schemes users run today with its
reference's published defaults; ``static`` holds the limit the gateway would start the upstream at (its sweep
result's sweet spot, else ``initial_limit``).

Anything else is ``module:attribute`` (as uvicorn names an app), where the attribute is a factory: a callable
taking no arguments that returns a fresh :class:`gateway.control.algorithm.LimitAlgorithm`, one per upstream
(a class with a default constructor is one). The gateway imports whatever it is given; nothing here knows of
a particular algorithm, so comparing schemes, or running one of your own, needs no change to the server.
As uvicorn does with its app (``--app-dir``, by default the current directory), the directory the gateway
starts in is searched first, so a module beside your config file is found without installing it.

Everything around the algorithm stays the gateway's: the limiter hands out the permits, the hard cap is
computed and given to the algorithm in its observation (the built-in controller honours it; another
algorithm decides for itself), and the limit it asks for is held within ``limit_min`` and ``limit_max``.
An algorithm that is also a :class:`gateway.control.algorithm.RequestObserver` hears of every request as
it ends, before its permit goes to anyone queued (``gateway.server.feedback.control_loop``).

A path that cannot be imported, names nothing callable, or builds something that is not a limit algorithm
is a configuration error: one line, exit 2, before the gateway listens.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import cast

from gateway.control.algorithm import LimitAlgorithm
from gateway.control.baselines import BUILT_IN, BuiltIn

#: One fresh algorithm per upstream, given the limit the gateway would start that upstream at without one (a
#: built-in's seam, ``gateway.control.baselines.BuiltIn``; an imported factory takes no argument and ignores it).
AlgorithmFactory = BuiltIn

# What every LimitAlgorithm has; checked on what the factory builds, since a Protocol cannot check it alone.
_MEMBERS = ("limit", "step", "state")


def load_factory(path: str) -> AlgorithmFactory:
    """The built-in ``path`` names, or the factory it imports. Raises ValueError with one line saying what is
    wrong."""
    if path in BUILT_IN:
        return BUILT_IN[path]
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"algorithm {path!r} is neither a built-in ({', '.join(BUILT_IN)}) nor of the form 'module:factory'"
        )
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - an ImportError, or whatever the module raised while importing
        raise ValueError(f"algorithm {path!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"algorithm {path!r}: module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise ValueError(f"algorithm {path!r}: {attribute!r} is a {type(target).__name__}, not a factory to call")
    factory: Callable[[], object] = target
    return lambda _limit: build(path, factory)


def build(path: str, factory: Callable[[], object]) -> LimitAlgorithm:
    """One algorithm from ``factory``, checked to be one."""
    try:
        algorithm = factory()
    except Exception as exc:  # noqa: BLE001 - whatever a user's factory raises is a configuration error
        raise ValueError(
            f"algorithm {path!r}: calling it with no arguments failed ({type(exc).__name__}: {exc})"
        ) from None
    missing = [name for name in _MEMBERS if not hasattr(algorithm, name)]
    if missing:
        raise ValueError(
            f"algorithm {path!r} built a {type(algorithm).__name__}, which is not a limit algorithm "
            f"(no {', '.join(missing)}; see gateway/control/algorithm.py)"
        )
    limit = getattr(algorithm, "limit")  # noqa: B009 (an object's limit, checked below before the cast)
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise ValueError(f"algorithm {path!r}: its limit is {limit!r}, not an int")
    return cast(LimitAlgorithm, algorithm)  # checked above, member by member
