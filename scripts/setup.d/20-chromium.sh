#!/usr/bin/env bash
# Debian's chromium for the dashboard's browser tests (tests/browser). Playwright drives it with
# executable_path=/usr/bin/chromium; Playwright's own browser download does not work here.
# Idempotent: does nothing when chromium is already installed.
set -u
if [ -x /usr/bin/chromium ]; then
  echo "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo '?')"
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "!!!! chromium is missing and this is not root: the browser tests (tests/browser) will SKIP"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/tmp/kvscope-chromium-apt.log 2>&1; then
  apt-get update -q >>/tmp/kvscope-chromium-apt.log 2>&1 || true
  if ! apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >>/tmp/kvscope-chromium-apt.log 2>&1; then
    echo "!!!! could not install chromium (see /tmp/kvscope-chromium-apt.log): the browser tests will SKIP"
    exit 0
  fi
fi
echo "chromium installed: $(/usr/bin/chromium --version 2>/dev/null || echo '?')"
