#!/usr/bin/env bash
# Install Debian's `redis-server` when it is missing from PATH. The replicas' shared-state tests
# (tests/integration/test_share_board.py, test_replicas_llama.py) start a real one, so `make test` calls this.
# Idempotent, quiet unless it fails, and loud with the reason when it does (see install-prometheus.sh).
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
    echo "redis: found $(command -v redis-server) ($(redis-server --version | head -n1))"
    exit 0
fi
fail() { echo "install-redis: $*" >&2; echo "install-redis: the shared-state tests cannot run without redis-server." >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || fail "redis-server is missing and apt-get is not available; install Redis yourself."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"
    else fail "redis-server is missing; installing it needs root (run as root, or give passwordless sudo)."; fi
fi
log="$(mktemp -t install-redis.XXXXXX.log)"
trap 'rm -f "$log"' EXIT
echo "redis: not found, installing Debian's 'redis-server' package with apt-get ..."
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >"$log" 2>&1 || { cat "$log" >&2; fail "'apt-get update' failed (see above)."; }
$SUDO apt-get install -y -q --no-install-recommends redis-server >>"$log" 2>&1 \
    || { cat "$log" >&2; fail "'apt-get install redis-server' failed (see above)."; }
command -v redis-server >/dev/null 2>&1 || fail "the package installed but redis-server is not on PATH (PATH=$PATH)."
echo "redis: installed $(command -v redis-server)"
