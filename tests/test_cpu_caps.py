"""The CPU reader that decides what the fp8 tests expect, on recorded /proc/cpuinfo files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.realvllm.cpu import parse_cpuinfo, this_cpu

RECORDED = Path(__file__).resolve().parent / "realvllm" / "cpuinfo"
EXPECT_FP8 = {
    "amd-epyc-avx512.txt": True,
    "amd-epyc-avx2-no-avx512.txt": False,
    "intel-xeon-amx-only.txt": True,
    "arm64-neoverse.txt": False,  # only the first processor block counts
    "garbage.txt": False,
}


@pytest.mark.parametrize("name", sorted(p.name for p in RECORDED.glob("*.txt")))
def test_fp8_support_is_read_from_every_recorded_cpuinfo(name: str) -> None:
    caps = parse_cpuinfo((RECORDED / name).read_text(errors="replace"))
    assert name in EXPECT_FP8, f"new capture {name}: add its expected answer"
    assert caps.fp8_kv is EXPECT_FP8[name], caps.describe()
    assert caps.describe()


def test_this_machine_is_described() -> None:
    caps = this_cpu()
    print(f"\nthis CPU: {caps.describe()}; fp8 KV on vLLM's CPU build: {caps.fp8_kv}")
    assert this_cpu(Path("/nonexistent/cpuinfo")).fp8_kv is False
