#!/usr/bin/env bash
# Install Prometheus (Debian's `prometheus` package, which ships `prometheus` and `promtool`) when either
# binary is missing from PATH. The dashboard / alert-rule tests start a real Prometheus and run promtool,
# so `make test` calls this first.
#
# Idempotent: does nothing (and prints one line) when both binaries are already there.
# Quiet: apt's chatter goes to a log file that is printed only when something fails.
# Loud on failure: exits non-zero with the reason (not root, no apt-get, apt-get failed, binaries still absent).
set -euo pipefail

have_both() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }

if have_both; then
    echo "prometheus: found $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
    exit 0
fi

fail() {
    echo "install-prometheus: $*" >&2
    echo "install-prometheus: the Prometheus tests cannot run without 'prometheus' and 'promtool' on PATH." >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 \
    || fail "prometheus/promtool are missing and apt-get is not available (not a Debian-like system); install Prometheus 2.x yourself."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        fail "prometheus/promtool are missing; installing them needs root (run as root, or give passwordless sudo)."
    fi
fi

log="$(mktemp -t install-prometheus.XXXXXX.log)"
trap 'rm -f "$log"' EXIT

echo "prometheus: not found, installing Debian's 'prometheus' package with apt-get ..."
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -q >"$log" 2>&1; then
    cat "$log" >&2
    fail "'apt-get update' failed (see above)."
fi
# --no-install-recommends: skip prometheus-node-exporter, the tests only need the server and promtool.
if ! $SUDO apt-get install -y -q --no-install-recommends prometheus >>"$log" 2>&1; then
    cat "$log" >&2
    fail "'apt-get install prometheus' failed (see above)."
fi

have_both || fail "the 'prometheus' package installed but 'prometheus'/'promtool' are still not on PATH (PATH=$PATH)."
echo "prometheus: installed $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
