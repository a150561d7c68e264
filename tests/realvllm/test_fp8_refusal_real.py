"""vLLM's fp8 refusal on a CPU without AVX-512 or AMX, shown on every machine.

Machines of this kind differ: where the CPU lacks AVX-512/AMX, vLLM's CPU build refuses
`--kv-cache-dtype fp8` at engine start, and test_controller_real.py then expects a rollback that
names vLLM's refusal. On a machine that has AVX-512 that branch cannot run as it is, so here the
real `vllm serve` starts with torch's two CPU-capability probes answering "no" (a sitecustomize on
PYTHONPATH: vLLM's own check, `_get_attn_isa`, asks exactly those) and the test checks what the
agent will read from its log: vLLM's own refusal line, as the rollout reports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from agent.failure_cause import failure_cause
from tests.ports import free_port
from tests.realvllm.cpu import FP8_REFUSAL
from tests.realvllm.server import Install, die_with_parent, serve_argv, server_env

pytestmark = pytest.mark.timeout(900)
NO_AVX512 = """
try:
    import torch
    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_amx_tile_supported = lambda: False
except Exception:
    pass
"""


def test_fp8_is_refused_with_vllms_own_words_on_a_cpu_without_avx512(
    realvllm_install: Install, realvllm_jobs: Path
) -> None:
    # The pool's server (if any) stays up, idle, for the next module: this vLLM stops at engine start.
    job = realvllm_jobs / "fp8-refusal"
    (job / "site").mkdir(parents=True, exist_ok=True)
    (job / "site" / "sitecustomize.py").write_text(NO_AVX512)
    env = server_env(job, {"PYTHONPATH": str(job / "site")})
    argv = serve_argv(realvllm_install, free_port(), ["--kv-cache-dtype", "fp8", "--enforce-eager"])
    with (job / "vllm.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent
        )
        try:
            rc = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            pytest.fail("vllm serve with fp8 on an emulated AVX2-only CPU neither failed nor stopped in 600 s")
    text = (job / "vllm.log").read_text(errors="replace")
    assert rc != 0, f"vLLM started with fp8 on an emulated AVX2-only CPU:\n{text[-2000:]}"
    cause = failure_cause(text)
    assert cause is not None and FP8_REFUSAL in cause, (cause, text[-3000:])
