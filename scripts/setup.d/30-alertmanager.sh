#!/usr/bin/env bash
# Debian's prometheus-alertmanager, for the alert delivery tests (tests/app/alerts, marker
# `alertmanager`). Idempotent: does nothing when the binary is already there. When it cannot
# install (not root, no network), it says so loudly and exits 0: those tests then SKIP with a reason.
set -u
have() { command -v alertmanager >/dev/null 2>&1 || [ -x /usr/bin/prometheus-alertmanager ]; }
if have; then
  echo "alertmanager: present ($(command -v alertmanager || echo /usr/bin/prometheus-alertmanager))"
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "!! alertmanager: not installed and not root: run 'apt-get install prometheus-alertmanager';"
  echo "!! the Alertmanager delivery tests will be SKIPPED"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy prometheus-alertmanager 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  apt-get update -qq -o DPkg::Lock::Timeout=900 || true
fi
# --no-install-recommends: the package itself is one static binary; skip the web UI extras.
# policy-rc.d keeps the package from starting a system service during install.
PRC=/usr/sbin/policy-rc.d
made_prc=0
if [ ! -e "$PRC" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$PRC" && chmod +x "$PRC" && made_prc=1
fi
apt-get install -y -qq -o DPkg::Lock::Timeout=900 --no-install-recommends prometheus-alertmanager >/dev/null 2>&1
rc=$?
[ "$made_prc" = 1 ] && rm -f "$PRC"
if [ $rc -ne 0 ] || ! have; then
  echo "!! alertmanager: apt-get install prometheus-alertmanager failed (rc=$rc);"
  echo "!! the Alertmanager delivery tests will be SKIPPED"
  exit 0
fi
# Make sure no service instance was left running by the package scripts.
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus-alertmanager >/dev/null 2>&1 || true; fi
echo "alertmanager: installed ($(command -v alertmanager || echo /usr/bin/prometheus-alertmanager))"
exit 0
