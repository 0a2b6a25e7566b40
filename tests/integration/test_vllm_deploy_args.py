"""The ``vllm serve`` arguments in ``docker-compose.yml`` and ``deploy/k8s/vllm.yaml``, parsed by vLLM's own parser.

No Docker engine or cluster runs here, but the pinned vLLM does (``make vllm``, the same version as the image
tag): its ``vllm serve`` parser reads each argument list exactly as the image's entry point would, so a flag
that vLLM does not know, or a value it cannot parse, fails the suite. The model must be the positional
argument (``--model`` is the deprecated spelling), and no deprecated option may be used.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.vllm import SERVE_ARGS, require_vllm

ROOT = Path(__file__).parent.parent.parent
DEFAULT = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def with_defaults(text: str) -> str:
    """Compose interpolation with every variable unset: ``${VAR:-default}`` -> default (the unit tests of
    ``docker-compose.yml`` check the full interpolation rules and ``.env.example``)."""
    return DEFAULT.sub(lambda m: m.group(2) or "", text)


def compose_args() -> list[str]:
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["vllm"]
    return [with_defaults(str(arg)) for arg in service["command"]]


def k8s_args() -> list[str]:
    for doc in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "vllm.yaml").read_text()):
        if doc and doc.get("kind") in ("Deployment", "StatefulSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "vllm":
                    return [str(arg) for arg in container["args"]]
    raise AssertionError("deploy/k8s/vllm.yaml has no Deployment or StatefulSet with a vllm container")


def parse(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([str(require_vllm()), str(SERVE_ARGS), *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"vllm serve rejects {args}:\n{done.stderr[-3000:]}", pytrace=False)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("where", ["docker-compose.yml", "deploy/k8s/vllm.yaml"])
def test_vllm_serve_accepts_the_deployed_arguments(where: str) -> None:
    args = compose_args() if where == "docker-compose.yml" else k8s_args()
    parsed = parse(args)
    assert parsed["model_tag"] == args[0] == parsed["model"], f"{where}: the model must come first, positional"
    assert "--model" not in args, f"{where}: --model is deprecated; the model is positional"
    assert parsed["deprecated"] == [], f"{where}: deprecated options {parsed['deprecated']}"
    assert parsed["options"]["port"] == 8000 and parsed["options"]["host"] == "0.0.0.0"
    assert parsed["options"]["max_num_seqs"] == 256


def test_an_unknown_flag_fails() -> None:
    """The check has teeth: vLLM's parser rejects what it does not know, with its own message."""
    done = subprocess.run(
        [str(require_vllm()), str(SERVE_ARGS), "some/model", "--max-num-sequences-typo", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "unrecognized arguments: --max-num-sequences-typo" in done.stderr
