"""Preflight: checks run on the agent before any restart, each pass / warn / refuse with numbers.

- the pinned CPU buffer against MemAvailable minus a headroom, the cgroup memory limit and the
  free space of /dev/shm (vLLM maps its buffer there), crediting what the restart frees;
- the power-of-two over-allocation of PyTorch's host allocator (up to ~2x the requested RAM),
  and the >= 512 GiB cudaHostRegister failure;
- a hybrid model (linear-attention / mamba layers) with CPU offload or LMCache: refused unless
  overridden (the reload crashes or hangs the engine; LMCache does not start);
- flags the installed vLLM does not accept (from its `serve --help` output).

Every reader takes its root path as a parameter (tests use recorded trees) and tolerates
missing or garbled files: an unknown number makes a check `warn`, never a crash.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

GIB = 1024**3
DEFAULT_HEADROOM_BYTES = 2 * GIB
CUDA_HOST_REGISTER_LIMIT = 512 * GIB
Status = Literal["pass", "warn", "refuse"]


@dataclass
class Check:
    name: str
    status: Status
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OffloadPlan:
    """The offload a profile asks for (the app sends it as payload['offload'])."""

    enabled: bool = False
    backend: str | None = None  # native | lmcache
    spec: str | None = None  # cpu | tiering
    pinned_bytes: int = 0
    fs_root: str | None = None
    connector: str | None = None  # OffloadingConnector | ExampleConnector | LMCacheConnectorV1 | ...
    disk_path: str | None = None  # a disk tier's folder (ExampleConnector, LMCache local disk)
    disk_min_free_bytes: int = 0

    @classmethod
    def from_payload(cls, data: Any) -> OffloadPlan:
        if not isinstance(data, dict):
            return cls()
        pinned = _int_or_zero(data.get("pinned_bytes"))
        return cls(
            enabled=bool(data.get("enabled")),
            backend=_opt_str(data.get("backend")),
            spec=_opt_str(data.get("spec")),
            pinned_bytes=max(0, pinned),
            fs_root=_opt_str(data.get("fs_root")),
            connector=_opt_str(data.get("connector")),
            disk_path=_opt_str(data.get("disk_path")),
            disk_min_free_bytes=_int_or_zero(data.get("disk_min_free_bytes")),
        )


@dataclass
class HostMemory:
    mem_total: int | None = None
    mem_available: int | None = None
    cgroup_limit: int | None = None  # None: unlimited or unknown
    cgroup_current: int | None = None
    shm_free: int | None = None


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _int_or_zero(v: Any) -> int:
    try:
        return max(0, int(v or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


# ---------------------------------------------------------------- readers
def read_meminfo(proc_root: Path) -> dict[str, int]:
    """/proc/meminfo as bytes per key; {} when unreadable."""
    out: dict[str, int] = {}
    try:
        text = (proc_root / "meminfo").read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?", line)
        if m:
            mult = 1024 if line.rstrip().endswith("kB") else 1
            out[m.group(1)] = int(m.group(2)) * mult
    return out


def cgroup_dir_for(proc_root: Path, cgroup_root: Path, pid: str = "self") -> Path | None:
    """The cgroup v2 folder of a process (from /proc/<pid>/cgroup), or the v1 memory folder."""
    try:
        text = (proc_root / pid / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        rel = path.lstrip("/")
        if hid == "0" and controllers == "":
            return cgroup_root / rel
        if "memory" in controllers.split(","):
            return cgroup_root / "memory" / rel
    return None


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    if raw == "max":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def read_cgroup(cg_dir: Path | None) -> tuple[int | None, int | None]:
    """(limit, current) in bytes; limit None when unlimited or unknown. v2 first, v1 fallback."""
    if cg_dir is None:
        return None, None
    if (cg_dir / "memory.max").exists() or (cg_dir / "memory.current").exists():
        return _read_int(cg_dir / "memory.max"), _read_int(cg_dir / "memory.current")
    limit = _read_int(cg_dir / "memory.limit_in_bytes")
    if limit is not None and limit >= 1 << 62:  # v1 "unlimited" is a huge page-rounded number
        limit = None
    return limit, _read_int(cg_dir / "memory.usage_in_bytes")


def statvfs_free(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def read_host_memory(
    proc_root: Path = Path("/proc"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    shm_dir: Path = Path("/dev/shm"),
    *,
    cgroup_dir: Path | None = None,
    shm_free: Callable[[Path], int | None] = statvfs_free,
) -> HostMemory:
    info = read_meminfo(proc_root)
    cg = cgroup_dir if cgroup_dir is not None else cgroup_dir_for(proc_root, cgroup_root)
    limit, current = read_cgroup(cg)
    return HostMemory(
        mem_total=info.get("MemTotal"),
        mem_available=info.get("MemAvailable"),
        cgroup_limit=limit,
        cgroup_current=current,
        shm_free=shm_free(shm_dir),
    )


# ---------------------------------------------------------------- memory checks
def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_memory(
    plan: OffloadPlan, mem: HostMemory, *, headroom_bytes: int = DEFAULT_HEADROOM_BYTES, reclaim_bytes: int = 0
) -> list[Check]:
    """The pinned buffer against RAM, the cgroup limit and /dev/shm. `reclaim_bytes` is the
    buffer of the running server, freed by the restart."""
    pinned = plan.pinned_bytes if plan.enabled else 0
    if pinned <= 0:
        return [Check("pinned_memory", "pass", "no pinned CPU buffer in this profile", {"pinned_bytes": 0})]
    checks: list[Check] = []
    if pinned >= CUDA_HOST_REGISTER_LIMIT:
        checks.append(
            Check(
                "pinned_register_limit",
                "refuse",
                f"pinned buffer {gib(pinned)} >= 512 GiB: one cudaHostRegister of that size fails",
                {"pinned_bytes": pinned, "limit_bytes": CUDA_HOST_REGISTER_LIMIT},
            )
        )
    nums: dict[str, Any] = {
        "pinned_bytes": pinned,
        "mem_available_bytes": mem.mem_available,
        "reclaim_bytes": reclaim_bytes,
        "headroom_bytes": headroom_bytes,
        "mem_total_bytes": mem.mem_total,
    }
    if mem.mem_available is None:
        checks.append(Check("pinned_vs_memavailable", "warn", "MemAvailable unreadable: cannot size the buffer", nums))
    else:
        room = mem.mem_available + reclaim_bytes - headroom_bytes
        nums["room_bytes"] = room
        text = (
            f"pinned buffer {gib(pinned)} vs MemAvailable {gib(mem.mem_available)} + {gib(reclaim_bytes)} "
            f"freed by the restart - {gib(headroom_bytes)} headroom = {gib(room)}"
        )
        checks.append(Check("pinned_vs_memavailable", "refuse" if pinned > room else "pass", text, nums))
    if mem.cgroup_limit is not None:
        current = mem.cgroup_current or 0
        room_cg = mem.cgroup_limit - current + reclaim_bytes - headroom_bytes
        cg_nums = {
            "pinned_bytes": pinned,
            "cgroup_limit_bytes": mem.cgroup_limit,
            "cgroup_current_bytes": current,
            "reclaim_bytes": reclaim_bytes,
            "headroom_bytes": headroom_bytes,
            "room_bytes": room_cg,
        }
        text = (
            f"pinned buffer {gib(pinned)} vs cgroup limit {gib(mem.cgroup_limit)} - {gib(current)} in use "
            f"+ {gib(reclaim_bytes)} freed - {gib(headroom_bytes)} headroom = {gib(room_cg)} "
            "(pinned memory counts as shmem against the limit: over it the engine is OOM-killed)"
        )
        checks.append(Check("pinned_vs_cgroup", "refuse" if pinned > room_cg else "pass", text, cg_nums))
    else:
        checks.append(Check("pinned_vs_cgroup", "pass", "no cgroup memory limit", {"cgroup_limit_bytes": None}))
    if plan.backend in (None, "native"):
        if mem.shm_free is None:
            checks.append(Check("pinned_vs_dev_shm", "warn", "/dev/shm free space unknown", {"pinned_bytes": pinned}))
        else:
            room_shm = mem.shm_free + reclaim_bytes
            text = (
                f"pinned buffer {gib(pinned)} vs /dev/shm free {gib(mem.shm_free)} + {gib(reclaim_bytes)} "
                f"freed = {gib(room_shm)}"
            )
            checks.append(
                Check(
                    "pinned_vs_dev_shm",
                    "refuse" if pinned > room_shm else "pass",
                    text,
                    {"pinned_bytes": pinned, "shm_free_bytes": mem.shm_free, "room_bytes": room_shm},
                )
            )
    checks.append(check_power_of_two(pinned, mem, headroom_bytes=headroom_bytes, reclaim_bytes=reclaim_bytes))
    return checks


def check_power_of_two(
    pinned: int, mem: HostMemory, *, headroom_bytes: int = DEFAULT_HEADROOM_BYTES, reclaim_bytes: int = 0
) -> Check:
    """PyTorch's host allocator rounds each pinned tensor up to a power of two: some vLLM versions
    used up to ~1.92x the requested RAM. Warn with the worst case."""
    worst = next_power_of_two(pinned)
    nums: dict[str, Any] = {"pinned_bytes": pinned, "worst_case_bytes": worst}
    if worst == pinned:
        return Check("power_of_two_overallocation", "pass", f"{gib(pinned)} is a power of two: no rounding", nums)
    room = None if mem.mem_available is None else mem.mem_available + reclaim_bytes - headroom_bytes
    nums["room_bytes"] = room
    text = (
        f"{gib(pinned)} may be rounded up to {gib(worst)} ({worst / pinned:.2f}x) by PyTorch's pinned "
        "host allocator in some vLLM versions"
    )
    if room is not None and worst > room:
        text += f"; that would not fit the {gib(room)} of room"
    return Check("power_of_two_overallocation", "warn", text, nums)


# ---------------------------------------------------------------- hybrid models
HYBRID_LAYER_WORDS = ("linear_attention", "mamba", "ssm", "recurrent", "gated_delta")


def find_model_config(root: str | None, model_dirs: Sequence[Path] = (), hf_cache: Path | None = None) -> Path | None:
    """config.json of the model `root` from /v1/models: a folder path, a folder under one of
    model_dirs, or a hub id in the Hugging Face cache."""
    if not root:
        return None
    candidates: list[Path] = []
    p = Path(root)
    if p.is_absolute():
        candidates.append(p / "config.json")
    for d in model_dirs:
        candidates.append(d / root.lstrip("/") / "config.json")
        candidates.append(d / p.name / "config.json")
    if hf_cache is not None and "/" in root and not p.is_absolute():
        snaps = hf_cache / ("models--" + root.replace("/", "--")) / "snapshots"
        try:
            candidates.extend(sorted(snaps.glob("*/config.json")))
        except OSError:
            pass
    for c in candidates:
        try:
            if c.is_file():
                return c
        except OSError:
            continue
    return None


def hybrid_from_config(config: dict[str, Any]) -> tuple[bool, str]:
    """(is hybrid, why) from a Hugging Face config.json (text_config looked into too)."""
    for cfg in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else None):
        if not isinstance(cfg, dict):
            continue
        layer_types = cfg.get("layer_types")
        if isinstance(layer_types, list):
            odd = [str(t) for t in layer_types if any(w in str(t).lower() for w in HYBRID_LAYER_WORDS)]
            if odd:
                kinds = sorted(set(odd))
                return True, f"layer_types has {len(odd)} of {len(layer_types)} layers {', '.join(kinds)}"
        pattern = cfg.get("hybrid_override_pattern")
        if isinstance(pattern, str) and "M" in pattern:
            return True, f"hybrid_override_pattern {pattern[:40]} has mamba layers"
        model_type = str(cfg.get("model_type", "")).lower()
        if any(w in model_type for w in ("mamba", "jamba", "qwen3_next", "falcon_h1", "nemotron_h", "zamba")):
            return True, f"model_type {model_type} is a hybrid / state-space model"
    return False, "no linear-attention or mamba layers in config.json"


def hybrid_from_cache_config(labels: dict[str, str]) -> tuple[bool | None, str]:
    """The running server's cache_config_info: vLLM sets a mamba block size / cache mode for
    hybrid models. None when the labels say nothing."""
    if not labels:
        return None, "no cache_config_info"
    mode = labels.get("mamba_cache_mode")
    mbs = labels.get("mamba_block_size")
    if labels.get("is_attention_free") == "True":
        return True, "cache_config_info is_attention_free=True"
    if mode not in (None, "", "none", "None"):
        return True, f"cache_config_info mamba_cache_mode={mode}"
    if mbs not in (None, "", "None"):
        return True, f"cache_config_info mamba_block_size={mbs}"
    if mode is None and mbs is None:
        return None, "cache_config_info has no mamba labels"
    return False, "cache_config_info shows no mamba state"


def check_hybrid(plan: OffloadPlan, config_path: Path | None, cache_labels: dict[str, str], *, override: bool) -> Check:
    hybrid: bool | None = None
    reasons: list[str] = []
    if config_path is not None:
        try:
            cfg = json.loads(config_path.read_text())
            h, why = hybrid_from_config(cfg if isinstance(cfg, dict) else {})
            hybrid = h
            reasons.append(f"{config_path}: {why}")
        except (OSError, ValueError) as exc:
            reasons.append(f"{config_path} unreadable: {exc}")
    h2, why2 = hybrid_from_cache_config(cache_labels)
    if h2 is not None:
        hybrid = bool(hybrid) or h2
        reasons.append(why2)
    nums: dict[str, Any] = {
        "hybrid": hybrid,
        "config": str(config_path) if config_path else None,
        "override": override,
        "offload_backend": plan.backend if plan.enabled else None,
    }
    why = "; ".join(reasons) or "model config not found and no cache_config_info"
    if not plan.enabled:
        return Check("hybrid_model", "pass", f"no offload in this profile ({why})", nums)
    if hybrid is None:
        return Check("hybrid_model", "warn", f"cannot tell whether the model is hybrid: {why}", nums)
    if not hybrid:
        return Check("hybrid_model", "pass", f"dense model: {why}", nums)
    what = (
        "LMCache does not start on hybrid models"
        if plan.backend == "lmcache"
        else ("CPU offload of a hybrid model: the reload crashes (HTTP 500) or hangs the engine")
    )
    if override:
        return Check("hybrid_model", "warn", f"{what}; overridden by the operator ({why})", nums)
    return Check("hybrid_model", "refuse", f"{what}; refused unless overridden ({why})", nums)


# ---------------------------------------------------------------- accepted flags
_FLAG = re.compile(r"(?<![\w-])(--[a-zA-Z0-9][a-zA-Z0-9_-]*)")


def flags_from_help(text: str) -> set[str]:
    """Every --flag mentioned in an argparse help text (with vLLM's --no-... twins)."""
    return set(_FLAG.findall(text))


def default_help_command(base_argv: Sequence[str]) -> list[str]:
    """`vllm serve ... --help=all` (vLLM's --help lists only groups), else base + --help."""
    is_vllm = any(os.path.basename(a) == "vllm" or "vllm.entrypoints" in a for a in base_argv)
    return [*base_argv, "--help=all"] if is_vllm else [*base_argv, "--help"]


def read_help(
    command: Sequence[str],
    *,
    timeout_s: float = 180.0,
    env: dict[str, str] | None = None,
    running: Callable[[subprocess.Popen[str] | None], None] | None = None,
) -> str | None:
    """The server's `--help` text (None: unreadable). It runs in a session of its own, killed with
    its children on the timeout; `running` is told the process while it runs (then None), so an
    agent that stops meanwhile can kill it instead of leaving it behind."""
    try:
        proc = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if running is not None:
        running(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_help(proc)
        return None
    finally:
        if running is not None:
            running(None)
    text = (out or "") + "\n" + (err or "")
    return text if _FLAG.search(text) else None


def kill_help(proc: subprocess.Popen[str]) -> None:
    """Kill a `--help` run and whatever it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=5)
    except (subprocess.SubprocessError, ValueError, OSError):
        pass


def check_flags(argv: Sequence[str], accepted: set[str] | None, *, source: str = "--help") -> Check:
    wanted = sorted({a.split("=", 1)[0] for a in argv if a.startswith("--")})
    if accepted is None:
        return Check(
            "accepted_flags", "warn", f"could not read the server's {source}: flags unchecked", {"flags": wanted}
        )
    unknown = [f for f in wanted if f not in accepted]
    if unknown:
        return Check(
            "accepted_flags",
            "refuse",
            f"the installed server does not accept {', '.join(unknown)} (per its {source})",
            {"unknown": unknown, "flags": wanted},
        )
    return Check("accepted_flags", "pass", f"all {len(wanted)} flags accepted", {"flags": wanted})


def check_fs_tier(plan: OffloadPlan) -> Check | None:
    if not plan.enabled or not plan.fs_root:
        return None
    root = Path(plan.fs_root)
    probe = root if root.exists() else root.parent
    free = statvfs_free(probe) if probe.exists() else None
    nums = {"fs_root": plan.fs_root, "free_bytes": free}
    if not probe.exists():
        return Check("fs_tier", "refuse", f"fs tier folder {root} and its parent do not exist", nums)
    if not os.access(probe, os.W_OK):
        return Check("fs_tier", "refuse", f"fs tier folder {probe} is not writable by the agent", nums)
    return Check("fs_tier", "pass", f"fs tier {root}: {gib(free)} free", nums)


# ---------------------------------------------------------------- argv facts
def pinned_bytes_from_argv(argv: Sequence[str]) -> int:
    """The pinned buffer a running argv asked for (to credit what a restart frees)."""
    flags: dict[str, str] = {}
    items = list(argv)
    for i, a in enumerate(items):
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                flags[k] = v
            elif i + 1 < len(items):
                flags[a] = items[i + 1]
    try:
        if "--kv-transfer-config" in flags:
            cfg = json.loads(flags["--kv-transfer-config"])
            return int(cfg.get("kv_connector_extra_config", {}).get("cpu_bytes_to_use") or 0)
        if "--kv-offloading-size" in flags:
            return int(float(flags["--kv-offloading-size"]) * GIB)
    except (ValueError, TypeError, AttributeError):
        return 0
    return 0


def summarize(checks: Sequence[Check]) -> Status:
    if any(c.status == "refuse" for c in checks):
        return "refuse"
    if any(c.status == "warn" for c in checks):
        return "warn"
    return "pass"
