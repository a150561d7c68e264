"""The rollback report names vLLM's own error line, found anywhere in the server's log."""

from __future__ import annotations

from pathlib import Path

from agent.failure_cause import failure_cause

FIX = Path(__file__).parent / "fixtures"


def test_real_vllm_cpu_offload_failure_log() -> None:
    """A real `vllm serve` (CPU build) with CPU offload: the cause is ~170 lines above the end."""
    text = (FIX / "real_vllm_cpu_offload_failure.log.txt").read_text()
    last_30 = "\n".join(text.splitlines()[-30:])
    assert "Exception: CPU Offloading" not in last_30  # a plain tail would miss it
    assert failure_cause(text) == "Exception: CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"


def test_wrappers_only_fall_back_to_the_first_wrapper() -> None:
    text = "INFO starting\nRuntimeError: Engine core initialization failed. See root cause above.\n"
    assert failure_cause(text) == "RuntimeError: Engine core initialization failed. See root cause above."


def test_warning_mentioning_an_error_name_is_not_a_cause() -> None:
    text = (
        "(APIServer pid=1) WARNING 11-29 09:11:25 [system_utils.py:255] Found ulimit ... like "
        "`OSError: [Errno 24] Too many open files`.\n"
    )
    assert failure_cause(text) is None


def test_plain_and_dotted_exception_names() -> None:
    assert failure_cause("torch.OutOfMemoryError: CUDA out of memory.") == "torch.OutOfMemoryError: CUDA out of memory."
    assert failure_cause("error: unrecognized arguments: --nope") is None
    assert failure_cause("") is None
