"""What this machine's CPU lets vLLM's CPU build do, read from /proc/cpuinfo.

vLLM's CPU backend (0.32.0) refuses `--kv-cache-dtype fp8` at engine start on an x86 CPU without
AVX-512 or AMX ("NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."), so
a test that switches dtypes asserts the doubling where the CPU has them and the refusal (then a
rollback) where it does not. The reader takes the text, so it is tested on recorded cpuinfo files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FP8_REFUSAL = "FP8 KV cache on CPU requires"


@dataclass(frozen=True)
class CpuCaps:
    model: str
    flags: frozenset[str]

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def amx(self) -> bool:
        return any(f.startswith("amx") for f in self.flags)

    @property
    def fp8_kv(self) -> bool:
        """Whether vLLM's CPU build accepts an fp8 KV cache here."""
        return self.avx512 or self.amx

    def describe(self) -> str:
        have = sorted(f for f in self.flags if f.startswith(("avx512f", "amx", "avx2")))
        return f"{self.model or 'unknown CPU'} ({', '.join(have) or 'no AVX2/AVX-512/AMX flags'})"


def parse_cpuinfo(text: str) -> CpuCaps:
    """Flags of the first processor block (x86 'flags', arm 'Features'); tolerant of anything else."""
    model = ""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if flags and not line.strip():
                break  # end of the first processor's block
            continue
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return CpuCaps(model=model, flags=flags)


def this_cpu(path: Path = Path("/proc/cpuinfo")) -> CpuCaps:
    try:
        return parse_cpuinfo(path.read_text(errors="replace"))
    except OSError:
        return CpuCaps(model="", flags=frozenset())
