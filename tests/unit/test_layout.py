"""The layout's rules (docs/architecture.md, "What may import what"), checked on the source: one test per rule,
named as the page states it. The checker reads every import, at the top of a module or inside a function."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"

#: The project's own top-level packages; an import of anything else is the standard library's or a dependency's.
FIRST_PARTY = ("gateway", "testbed", "bench", "tests")
#: ``import gateway`` / ``from gateway import __version__``: the package's own ``__init__``, which imports nothing.
PACKAGE_ROOT = frozenset({"gateway", "gateway.__version__"})
#: What the pure controller may import besides itself: pydantic, and standard-library modules that do no I/O, never
#: wait and read no clock. ``random`` is here only for a generator seeded explicitly, which the randomness rule checks.
PURE = (
    "__future__",
    "abc",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "math",
    "numbers",
    "operator",
    "statistics",
    "typing",
    "pydantic",
    "random",
)
#: The control package's value types: what a telemetry source may speak in.
CONTROL_VALUES = ("gateway.control.observation", "gateway.control.window", "gateway.control.algorithm")
#: The tools, each named after its CLI verb.
TOOLS = ("gateway.sim", "gateway.sweep", "gateway.plan", "gateway.demo")
#: The one tool module the server reads: the sweep's result file, the contract between ``sweetspot sweep`` and
#: ``sweetspot serve --sweep-result``.
SERVER_MAY_READ = ("gateway.sweep.result",)
#: What the demo runs (as child processes, through their modules' helpers): the simulator and a sweep.
DEMO_MAY_RUN = ("gateway.sim", "gateway.sweep")
#: What a CLI module may import when it loads: the command itself, and the settings its flags are made from.
CLI_MAY_LOAD = ("gateway.cli", "gateway.settings")
#: What only the tools need: the base install (what ``sweetspot serve`` imports) leaves them out.
TOOL_PACKAGES = ("numpy", "matplotlib", "gguf")
#: ``os`` members that read (or change) the process's environment.
ENVIRONMENT = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


# --- the checker ------------------------------------------------------------------------------------------
def module_name(path: Path) -> str:
    """``gateway/server/app.py`` -> ``gateway.server.app``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return set()


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found |= _names(node)
    return found


def imports_at_load(path: Path) -> set[str]:
    """What importing ``path`` imports: every import but those inside a function's body."""
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while pending:
        node = pending.pop()
        found |= _names(node)
        pending.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        )
    return found


def files_under(package: str) -> list[Path]:
    """The source files of ``package`` (``gateway.control``, ``bench``, ...), wherever it sits under the root."""
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def modules_under(package: str) -> dict[str, set[str]]:
    return {module_name(path): imports(path) for path in files_under(package)}


def under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def offending(package: str, forbidden: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """Imports by ``package``'s modules of anything under ``forbidden`` and not under ``allowed``."""
    forbidden, allowed = tuple(forbidden), tuple(allowed)
    return [
        f"{module} imports {name}"
        for module, names in modules_under(package).items()
        for name in sorted(names)
        if under(name, forbidden) and not under(name, allowed)
    ]


def outside(package: str, may: Iterable[str], among: Iterable[str] = FIRST_PARTY) -> list[str]:
    """Imports by ``package``'s modules of anything under ``among`` that is under none of ``may``."""
    may, among = tuple(may), tuple(among)
    return [
        f"{module} imports {name}"
        for module, names in modules_under(package).items()
        for name in sorted(names)
        if under(name, among) and not under(name, may) and name not in PACKAGE_ROOT
    ]


def unseeded_randomness(path: Path) -> list[str]:
    """Every use of the ``random`` module in ``path`` but ``random.Random(seed)`` with one explicit seed: the
    module's own functions draw from a generator seeded from the OS, and ``Random()`` or ``Random(None)`` is one
    too, so either would make a run unrepeatable."""
    tree = ast.parse(path.read_text(), str(path))
    bad: list[str] = []
    seeded: set[int] = set()  # the ``random.Random`` attribute nodes of well-seeded calls
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "random":
            bad.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            bad += [
                f"line {node.lineno}: import random as {a.asname}"
                for a in node.names
                if a.name == "random" and a.asname
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "random"
            and node.func.attr == "Random"
            and len(node.args) == 1
            and not node.keywords
            and not (isinstance(node.args[0], ast.Constant) and node.args[0].value is None)
        ):
            seeded.add(id(node.func))
    used_as_attribute: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "random":
            used_as_attribute.add(id(node.value))
            if id(node) not in seeded:
                bad.append(f"line {node.lineno}: random.{node.attr} (only random.Random(seed) is repeatable)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "random" and id(node) not in used_as_attribute:
            bad.append(f"line {node.lineno}: the random module itself handed on")
    return bad


def environment_reads(path: Path) -> list[str]:
    """Every reach into the process environment in ``path`` (``os.environ``, ``os.getenv``, ...), except handing
    it on whole to a child process as ``dict(os.environ)``."""
    tree = ast.parse(path.read_text(), str(path))
    handed_on = {
        id(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and len(node.args) == 1
        and not node.keywords
    }
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            bad += [f"line {node.lineno}: from os import {a.name}" for a in node.names if a.name in ENVIRONMENT]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ENVIRONMENT
            and not (node.attr == "environ" and id(node) in handed_on)
        ):
            bad.append(f"line {node.lineno}: os.{node.attr}")
    return bad


def test_the_rule_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from gateway.sim import engine\n    import gateway.demo.run\n")
    assert {"os", "gateway.sim", "gateway.sim.engine", "gateway.demo.run"} <= imports(source)
    assert imports_at_load(source) == {"os"}
    assert module_name(ROOT / "bench" / "soak.py") == "bench.soak"
    assert module_name(ROOT / "testbed" / "scenarios" / "__init__.py") == "testbed.scenarios"


def test_the_rule_checker_tells_a_seeded_generator_from_the_global_one(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import random\n"
        "ok = random.Random(seed)\n"
        "a = random.random()\n"
        "b = random.Random()\n"
        "c = random.Random(None)\n"
        "d = random.SystemRandom(1)\n"
        "e = f(random)\n"
        "from random import choice\n"
    )
    assert sorted(int(line.split(":")[0].removeprefix("line ")) for line in unseeded_randomness(source)) == [
        3,
        4,
        5,
        6,
        7,
        8,
    ]


def test_the_rule_checker_tells_reading_the_environment_from_handing_it_on(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import os\nenv = dict(os.environ)\na = os.environ['X']\nb = os.getenv('X')\nfrom os import environ\n"
    )
    assert sorted(int(line.split(":")[0].removeprefix("line ")) for line in environment_reads(source)) == [3, 4, 5]


def test_the_page_names_a_test_for_each_rule_and_each_rule_test_is_named_there() -> None:
    """docs/architecture.md lists each rule with the test that checks it: the two lists are the same."""
    import re

    page = set(re.findall(r"`(test_[a-z0-9_]+)`", (ROOT / "docs" / "architecture.md").read_text()))
    here = {name for name in globals() if name.startswith("test_") and not name.startswith("test_the_rule_checker")}
    assert page == here - {"test_the_page_names_a_test_for_each_rule_and_each_rule_test_is_named_there"}


# --- the rules, as docs/architecture.md states them -----------------------------------------------------
def test_the_controller_is_pure() -> None:
    """Observations in, decisions out: gateway.control imports only itself, pydantic and standard-library
    modules that do no I/O, never wait and read no clock; so no server, telemetry, settings, common, CLI, tool,
    test, testbed or benchmark module either."""
    bad = [
        f"{module} imports {name}"
        for module, names in modules_under("gateway.control").items()
        for name in sorted(names)
        if not under(name, ("gateway.control", *PURE))
    ]
    assert bad == [], "add a module to PURE only if it does no I/O, never waits and reads no clock"


def test_the_controllers_only_randomness_is_a_generator_seeded_by_its_caller() -> None:
    """A baseline's probe jitter comes from ``random.Random(seed)``, never the random module's own functions."""
    bad = {module_name(path): found for path in files_under("gateway.control") if (found := unseeded_randomness(path))}
    assert bad == {}


def test_telemetry_observes_and_decides_nothing() -> None:
    """gateway.telemetry imports of the project only itself and control's value types (the observation, the
    window's samples, the decision's enums): no algorithm, no controller, no server, no settings, no tool."""
    assert outside("gateway.telemetry", ("gateway.telemetry", *CONTROL_VALUES)) == []


def test_the_server_imports_no_tool_but_the_sweeps_result_file() -> None:
    assert offending("gateway.server", (*TOOLS, "gateway.cli"), allowed=SERVER_MAY_READ) == []


def test_common_imports_nothing_else_of_the_project() -> None:
    """gateway.common is what the server and the tools share: it imports neither of them, nor control."""
    assert outside("gateway.common", ("gateway.common",)) == []


def test_the_tools_import_no_server_module() -> None:
    """What a tool shares with the server (serving an ASGI app, the resend rule, header names, the process
    manager) is in gateway.common."""
    for tool in TOOLS:
        assert offending(tool, ("gateway.server",)) == [], tool


def test_the_tools_do_not_import_each_other_but_the_demo_runs_the_simulator_and_a_sweep() -> None:
    for tool in TOOLS:
        others = tuple(t for t in TOOLS if t != tool)
        assert offending(tool, others, allowed=DEMO_MAY_RUN if tool == "gateway.demo" else ()) == [], tool


def test_the_cli_imports_a_verbs_work_only_when_the_verb_runs() -> None:
    """At load, a CLI module imports of the project only gateway.cli and the settings (``serve``'s flags are the
    settings' fields), so ``sweetspot --help`` loads no server and no tool (nor their dependencies)."""
    bad = [
        f"{module_name(path)} imports {name} at load"
        for path in (*files_under("gateway.cli"), PACKAGE / "__main__.py")
        for name in sorted(imports_at_load(path))
        if under(name, FIRST_PARTY) and not under(name, CLI_MAY_LOAD)
    ]
    assert bad == []


def test_nothing_imports_the_cli_but_the_package_main() -> None:
    """``python -m gateway`` and the ``sweetspot`` script are the CLI's only callers; it is no library."""
    bad = [
        finding
        for package in ("gateway", "testbed", "bench")
        for finding in offending(package, ("gateway.cli",))
        if not under(finding.split(" ")[0], ("gateway.cli", "gateway.__main__"))
    ]
    assert bad == []


def test_no_shipped_module_imports_tests_testbed_or_bench() -> None:
    assert offending("gateway", ("tests", "testbed", "bench")) == []


def test_testbed_imports_no_tests_or_bench_module() -> None:
    assert offending("testbed", ("tests", "bench")) == []


def test_bench_imports_no_tests_module() -> None:
    assert offending("bench", ("tests",)) == []


def test_only_settings_reads_the_environment() -> None:
    """The process manager hands the environment on whole to what it starts; no other module reads it."""
    bad = {
        module_name(path): found
        for path in files_under("gateway")
        if path != PACKAGE / "settings.py" and (found := environment_reads(path))
    }
    assert bad == {}


def test_no_two_modules_share_a_name() -> None:
    names = Counter(p.name for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert [name for name, count in names.items() if count > 1] == []


def test_the_serve_path_runs_without_the_tools_dependencies() -> None:
    """With numpy, matplotlib and gguf made unimportable, the server app builds, the CLI lists every verb, and a
    tool's verb says which extra it needs instead of a traceback."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {TOOL_PACKAGES!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    serve = blocker + (
        "from gateway.server.app import create_server_app\n"
        "from gateway.settings import Settings\n"
        "create_server_app(Settings(upstreams=['http://127.0.0.1:9']))\n"
        "assert not any(m.split('.')[0] in " + repr(TOOL_PACKAGES) + " for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", serve], check=True, cwd=ROOT, timeout=60)
    cli = blocker + "sys.argv = ['sweetspot'] + sys.argv[1:]\nfrom gateway.cli import main\nmain()\n"
    listed = subprocess.run([sys.executable, "-c", cli, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for verb in ("serve", "sim", "sweep", "plan", "demo"):
        assert verb in listed.stdout
    tool = subprocess.run(
        [sys.executable, "-c", cli, "sim", "--port", "0"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert tool.returncode == 2 and "sweetspot-gateway[tools]" in tool.stderr, tool.stderr


def test_the_image_installs_the_locked_serve_dependencies_only() -> None:
    """requirements.lock pins (with hashes) what the base install needs, and nothing only the tools need."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = (ROOT / "requirements.lock").read_text()
    pinned = {line.split("==")[0].strip().lower() for line in lock.splitlines() if "==" in line and line[0].isalpha()}
    for requirement in project["dependencies"]:
        name = requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
        assert name in pinned, f"{name} is a base dependency but not in requirements.lock (make lock)"
    for name in TOOL_PACKAGES:
        assert name not in pinned, f"{name} is only the tools' and must not be in the image"
    assert all("--hash=sha256:" in block for block in lock.split("\n\n")[1:] if "==" in block)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes -r requirements.lock" in dockerfile and "--no-deps ." in dockerfile
