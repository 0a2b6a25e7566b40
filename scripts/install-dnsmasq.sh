#!/usr/bin/env bash
# Install Debian's `dnsmasq-base` (the dnsmasq binary alone, no system service) when dnsmasq is missing. The DNS
# discovery test (tests/integration/test_discovery_dns.py) runs its own dnsmasq on a loopback port as the resolver
# it controls, so `make test` calls this. Idempotent, quiet unless it fails, and loud with the reason when it does
# (see install-redis.sh).
set -euo pipefail

# Debian puts it in /usr/sbin, which an unprivileged user's PATH often lacks; the test looks there too.
export PATH="$PATH:/usr/sbin:/sbin"
if command -v dnsmasq >/dev/null 2>&1; then
    echo "dnsmasq: found $(command -v dnsmasq) ($(dnsmasq --version | head -n1))"
    exit 0
fi
fail() { echo "install-dnsmasq: $*" >&2; echo "install-dnsmasq: the DNS discovery test cannot run without dnsmasq." >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || fail "dnsmasq is missing and apt-get is not available; install dnsmasq yourself."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"
    else fail "dnsmasq is missing; installing it needs root (run as root, or give passwordless sudo)."; fi
fi
log="$(mktemp -t install-dnsmasq.XXXXXX.log)"
trap 'rm -f "$log"' EXIT
echo "dnsmasq: not found, installing Debian's 'dnsmasq-base' package with apt-get ..."
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >"$log" 2>&1 || { cat "$log" >&2; fail "'apt-get update' failed (see above)."; }
$SUDO apt-get install -y -q --no-install-recommends dnsmasq-base >>"$log" 2>&1 \
    || { cat "$log" >&2; fail "'apt-get install dnsmasq-base' failed (see above)."; }
command -v dnsmasq >/dev/null 2>&1 || fail "the package installed but dnsmasq is not on PATH (PATH=$PATH)."
echo "dnsmasq: installed $(command -v dnsmasq)"
