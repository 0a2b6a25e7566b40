"""The layout's rules (docs/architecture.md), checked on the source: what may import what, one name per module,
and a base install that serves without the tools' dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"

#: Standard-library modules that do I/O, wait or read a clock: the pure controller imports none of them.
IMPURE = {
    "asyncio",
    "socket",
    "time",
    "threading",
    "subprocess",
    "os",
    "urllib",
    "http",
    "logging",
    "aiohttp",
    "httpx",
    "requests",
    "random",
    "datetime",
    "selectors",
}
#: The tools, each named after its CLI verb: the server imports none of them...
TOOLS = ("gateway.sim", "gateway.sweep", "gateway.plan", "gateway.demo")
#: ... except the sweep's result file, the contract between ``sweetspot sweep`` and ``--sweep-result``.
SERVER_MAY_READ = frozenset({"gateway.sweep.result"})
#: What only the tools need: the base install (what ``sweetspot serve`` imports) leaves them out.
TOOL_PACKAGES = ("numpy", "matplotlib", "gguf")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules_under(package: str) -> dict[str, set[str]]:
    folder = ROOT / package.replace(".", "/")
    return {module_name(path): imports(path) for path in sorted(folder.rglob("*.py"))}


def offending(package: str, forbidden: tuple[str, ...], allowed: frozenset[str] = frozenset()) -> list[str]:
    bad = []
    for module, names in modules_under(package).items():
        for name in sorted(names):
            if name in allowed or any(name == a or name.startswith(a + ".") for a in allowed):
                continue
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{module} imports {name}")
    return bad


def test_the_rule_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from gateway.sim import engine\n    import gateway.demo.run\n")
    assert {"os", "gateway.sim", "gateway.sim.engine", "gateway.demo.run"} <= imports(source)


def test_the_controller_is_pure() -> None:
    """Observations in, decisions out: no server, no simulator, no tools, no I/O, no clock."""
    assert (
        offending(
            "gateway.control",
            ("gateway.server", "gateway.telemetry", "gateway.settings", "tests", *TOOLS, *sorted(IMPURE)),
        )
        == []
    )


def test_the_server_imports_no_tool_and_no_test_tooling() -> None:
    assert offending("gateway.server", (*TOOLS, "tests"), allowed=SERVER_MAY_READ) == []


def test_telemetry_observes_and_decides_nothing() -> None:
    assert (
        offending(
            "gateway.telemetry",
            ("gateway.server", "gateway.control.knee_search.aimd", "gateway.control.controller", "tests", *TOOLS),
        )
        == []
    )


def test_no_shipped_module_imports_test_tooling() -> None:
    assert offending("gateway", ("tests",)) == []


def test_the_tools_do_not_import_each_other_except_the_demo() -> None:
    """The demo runs the simulator and a sweep; the other tools stand alone."""
    for tool in ("gateway.sim", "gateway.sweep", "gateway.plan"):
        others = tuple(t for t in TOOLS if t != tool)
        assert offending(tool, others) == [], tool


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
