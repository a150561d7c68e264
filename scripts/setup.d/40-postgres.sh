#!/usr/bin/env bash
# Debian's PostgreSQL server binaries, for the tests that run storage and API tests on a real
# PostgreSQL (tests/pg.py starts a throwaway cluster in a temp dir, as a non-root user, on a
# loopback port; no system service is used). Idempotent: does nothing when initdb is there.
# When it cannot install (not root, no network) it says so loudly and exits 0: the postgres
# variants of the tests then SKIP with a reason.
set -u
have() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }
if have; then
  echo "postgres: present ($(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1))"
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "!! postgres: not installed and not root: run 'apt-get install postgresql';"
  echo "!! the PostgreSQL variants of the storage/API tests will be SKIPPED"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy postgresql 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  apt-get update -qq -o DPkg::Lock::Timeout=900 || true
fi
# policy-rc.d keeps the package from starting the system cluster during install.
PRC=/usr/sbin/policy-rc.d
made_prc=0
if [ ! -e "$PRC" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$PRC" && chmod +x "$PRC" && made_prc=1
fi
apt-get install -y -qq -o DPkg::Lock::Timeout=900 --no-install-recommends postgresql >/dev/null 2>&1
rc=$?
[ "$made_prc" = 1 ] && rm -f "$PRC"
if [ $rc -ne 0 ] || ! have; then
  echo "!! postgres: apt-get install postgresql failed (rc=$rc);"
  echo "!! the PostgreSQL variants of the storage/API tests will be SKIPPED"
  exit 0
fi
echo "postgres: installed ($(ls /usr/lib/postgresql/*/bin/initdb | tail -1))"
exit 0
