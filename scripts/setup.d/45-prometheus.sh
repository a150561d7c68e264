#!/usr/bin/env bash
# Debian's prometheus (server + promtool), for the Prometheus-source tests (tests/scale) and
# bench/query_backends.py: the tests start their own Prometheus on a loopback port in a temp dir.
# Idempotent: does nothing when the binaries are there. When it cannot install (not root, no
# network) it says so loudly and exits 0: those tests then SKIP with a reason.
set -u
have() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }
if have; then
  echo "prometheus: present ($(command -v prometheus))"
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "!! prometheus: not installed and not root: run 'apt-get install prometheus';"
  echo "!! the Prometheus source tests will be SKIPPED"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  apt-get update -qq -o DPkg::Lock::Timeout=900 || true
fi
# policy-rc.d keeps the package from starting a system service during install.
PRC=/usr/sbin/policy-rc.d
made_prc=0
if [ ! -e "$PRC" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$PRC" && chmod +x "$PRC" && made_prc=1
fi
apt-get install -y -qq -o DPkg::Lock::Timeout=900 --no-install-recommends prometheus >/dev/null 2>&1
rc=$?
[ "$made_prc" = 1 ] && rm -f "$PRC"
if [ $rc -ne 0 ] || ! have; then
  echo "!! prometheus: apt-get install prometheus failed (rc=$rc);"
  echo "!! the Prometheus source tests will be SKIPPED"
  exit 0
fi
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
echo "prometheus: installed ($(command -v prometheus))"
exit 0
