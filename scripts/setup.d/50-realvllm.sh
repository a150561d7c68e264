#!/usr/bin/env bash
# A real vLLM (CPU build) and a tiny local model for the `realvllm` tests (issue 6).
# Cached under $KVSCOPE_REALVLLM_HOME (default ~/.cache/kvscope/realvllm): minutes on a fresh
# machine, a second afterwards. On failure it says so loudly; the tests then skip with the reason.
# Set KVSCOPE_REALVLLM=0 to skip it on purpose (the tests then skip and say so).
set -euo pipefail
if [ "${KVSCOPE_REALVLLM:-1}" = "0" ]; then
  echo "!! realvllm: KVSCOPE_REALVLLM=0: not setting up the real vLLM; its tests will be SKIPPED"
  exit 0
fi
exec bash "$(dirname "$0")/../../tests/realvllm/setup.sh"
