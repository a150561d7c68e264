"""vLLM's flags (spellings and defaults) and the effective engine config the simulator derives from them.

`add_vllm_arguments` adds the flags to an argparse parser (unknown flags are then rejected by
argparse exactly the way `vllm serve` rejects them: `error: unrecognized arguments: ...`, exit 2).
`build_config` turns parsed flags into an `EngineConfig`, raising `StartupError` with vLLM-like
text for invalid combinations (vLLM exits 1 after an engine start-up failure).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from typing import Any

from simulator.personalities import PERSONALITIES
from simulator.profiles import DTYPE_BYTES, GIB, PROFILES, Profile, get_profile

KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
EVICTION_POLICIES = ("lru", "arc")
SPEC_NAMES = ("CPUOffloadingSpec", "TieringOffloadingSpec")


class StartupError(Exception):
    """The engine failed to start: `text` is what vLLM would print last (the root-cause lines)."""

    def __init__(self, text: str, exit_code: int = 1) -> None:
        super().__init__(text)
        self.text = text
        self.exit_code = exit_code


def _int_with_suffix(value: str) -> int:
    """vLLM accepts human-readable sizes for some ints: 32k, 1K, 256MiB ..."""
    v = value.strip()
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "k": 1000, "m": 1000**2, "g": 1000**3}
    low = v.lower()
    for suffix, mult in units.items():
        if low.endswith(suffix):
            return int(float(low[: -len(suffix)]) * mult)
    return int(v)


def add_vllm_arguments(p: argparse.ArgumentParser) -> None:
    """The `vllm serve` flags the simulator understands (and the sim-only ones, prefixed --sim- or named)."""
    p.add_argument("model_tag", nargs="?", default=None, help="model name or path (vLLM positional)")
    p.add_argument("--model", default=None)
    p.add_argument("--profile", default="rtx4070-qwen3-4b", choices=sorted(PROFILES), help="simulated model + device")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--max-model-len", type=_int_with_suffix, default=None)
    p.add_argument("--block-size", type=int, default=None, choices=[1, 8, 16, 32, 64, 128, 256])
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory-bytes", type=_int_with_suffix, default=None)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES))
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--kv-offloading-size", type=float, default=None)
    p.add_argument("--kv-offloading-backend", default="native", choices=["native", "lmcache"])
    p.add_argument("--kv-transfer-config", default=None)
    p.add_argument("--mamba-cache-mode", default=None, choices=["none", "align", "all"])
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument(
        "--uvicorn-log-level", default="info", choices=["debug", "info", "warning", "error", "critical", "trace"]
    )
    # simulator-only
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds before the port opens")
    p.add_argument(
        "--hybrid-failure",
        default="hang",
        choices=["crash", "hang"],
        help="hybrid + offload reload: crash (older builds) or hang (newer builds)",
    )
    p.add_argument("--sim-shm-dir", default="/dev/shm", help="where the offload buffer file is created")
    p.add_argument("--sim-state-dir", default=None, help="state files for kvscope-fake-nvidia-smi")
    p.add_argument("--sim-gpu-index", type=int, default=0)
    p.add_argument("--enable-server-load-tracking", action="store_true", help="serve GET /load (vLLM)")
    p.add_argument(
        "--sim-metric-names",
        default="current",
        choices=["current", "legacy"],
        help="legacy: older builds' names (gpu_cache_usage_perc, gpu_prefix_cache_*, "
        "time_per_output_token_seconds; no by-source or new offload families)",
    )
    p.add_argument(
        "--sim-engine",
        default="vllm",
        choices=list(PERSONALITIES),
        help="which engine's families /metrics exports: vllm, or the same model as SGLang's or "
        "TensorRT-LLM's (simulator/personalities.py)",
    )
    p.add_argument(
        "--sim-time-scale",
        type=float,
        default=1.0,
        help="run the model this many times faster than the wall clock (modeled times unchanged)",
    )
    p.add_argument(
        "--sim-jitter",
        type=float,
        default=0.0,
        help="seeded log-normal noise on modeled times: sigma per engine step / transfer (0.05 = 5%%), "
        "and 0.6 x sigma once per server start (run-to-run drift); 0 = deterministic",
    )


@dataclass(frozen=True)
class SecondaryTier:
    type: str
    root_dir: str
    n_read_threads: int = 4
    n_write_threads: int = 4


@dataclass(frozen=True)
class OffloadConfig:
    backend: str  # native | lmcache
    spec_name: str  # CPUOffloadingSpec | TieringOffloadingSpec ("LMCache" for lmcache)
    cpu_bytes: int
    chunk_tokens: int  # offload block size in tokens (a multiple of the GPU block size)
    eviction_policy: str
    store_threshold: int
    offload_prompt_only: bool
    secondary_tiers: tuple[SecondaryTier, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig:
    profile: Profile
    served_model_name: str
    model_path: str
    max_model_len: int
    block_size: int
    user_specified_block_size: bool
    cache_dtype: str
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    pool_bytes: int
    num_gpu_blocks: int
    num_gpu_blocks_override: int | None
    bytes_per_token: float  # GPU pool bytes per cached token (hybrid: incl. state checkpoints)
    kv_bytes_per_token: int  # K/V bytes moved per token on load/store
    enable_prefix_caching: bool
    mamba_cache_mode: str
    max_num_seqs: int
    max_num_batched_tokens: int
    offload: OffloadConfig | None
    kv_offloading_size: float | None
    kv_offloading_backend: str
    hybrid_failure: str
    seed: int
    sim_jitter: float = 0.0  # log-normal sigma of step/transfer times; 0.6 x sigma per server start

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def cpu_num_chunks(self) -> int:
        if self.offload is None:
            return 0
        return int(self.offload.cpu_bytes // (self.offload.chunk_tokens * self.bytes_per_token))

    def cache_config_labels(self) -> dict[str, str]:
        """`vllm:cache_config_info` labels: CacheConfig fields as Python str(), like vLLM."""
        hybrid = self.profile.model.is_hybrid
        return {
            "_block_size_resolved": "True",
            "block_size": str(self.block_size),
            "cache_dtype": self.cache_dtype,
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": str(self.block_size),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(self.enable_prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": str(self.kv_cache_size_tokens / self.max_model_len),
            "kv_cache_memory_bytes": str(self.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(self.kv_cache_size_tokens),
            "kv_offloading_backend": self.kv_offloading_backend,
            "kv_offloading_size": str(self.kv_offloading_size),
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": str(self.block_size) if hybrid else "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": self.mamba_cache_mode,
            "mamba_page_size_padded": str(self.profile.model.linear_state_bytes) if hybrid else "None",
            "mamba_ssm_cache_dtype": "auto",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(self.num_gpu_blocks),
            "num_gpu_blocks_override": str(self.num_gpu_blocks_override),
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "sha256",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": str(self.user_specified_block_size),
        }

    def offload_config_labels(self) -> dict[str, str] | None:
        """`vllm:kv_offload_config_info` labels (newest builds; native connector only)."""
        if self.offload is None or self.offload.backend != "native":
            return None
        o = self.offload
        return {
            "engine": "0",
            "model_name": self.served_model_name,
            "spec_name": o.spec_name,
            "cpu_num_chunks": str(self.cpu_num_chunks),
            "cpu_kv_bytes_per_chunk": str(int(o.chunk_tokens * self.bytes_per_token)),
            "cpu_bytes_to_use": str(o.cpu_bytes),
            "offload_block_size": str(o.chunk_tokens),
            "eviction_policy": o.eviction_policy,
            "store_threshold": str(o.store_threshold),
            "offload_prompt_only": str(o.offload_prompt_only),
            "secondary_tiers": ",".join(f"{t.type}:{t.root_dir}" for t in o.secondary_tiers) or "None",
        }


def _value_error(msg: str) -> StartupError:
    return StartupError(
        f"ValueError: {msg}\nRuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )


def _parse_transfer_config(raw: str, gpu_block: int, profile: Profile) -> OffloadConfig:
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StartupError(f"argument --kv-transfer-config: invalid loads value: '{raw}' ({exc})", 2) from None
    if not isinstance(cfg, dict):
        raise StartupError("argument --kv-transfer-config: expected a JSON object", 2)
    connector = cfg.get("kv_connector")
    extra = cfg.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise _value_error("kv_connector_extra_config must be a dict")
    if connector in ("LMCacheConnectorV1", "LMCacheConnector"):
        if profile.model.is_hybrid:
            raise _hybrid_lmcache_error()
        return OffloadConfig(
            "lmcache",
            "LMCache",
            int(float(extra.get("lmcache.max_local_cpu_size") or extra.get("max_local_cpu_size") or 5) * GIB),
            gpu_block,
            "lru",
            1,
            True,
            (),
            cfg,
        )
    if connector != "OffloadingConnector":
        raise _value_error(
            f"kv_connector {connector!r} is not simulated; kvscope sim supports OffloadingConnector "
            "and LMCacheConnectorV1 (a disk tier through ExampleConnector needs a real vLLM: it runs on "
            "the CPU build)"
        )
    spec = extra.get("spec_name", "CPUOffloadingSpec")
    if spec not in SPEC_NAMES:
        raise _value_error(f"Unknown offloading spec {spec!r}; expected one of {list(SPEC_NAMES)}")
    if "cpu_bytes_to_use" in extra:
        cpu_bytes = int(float(extra["cpu_bytes_to_use"]))
    elif "num_cpu_blocks" in extra:
        cpu_bytes = -int(extra["num_cpu_blocks"])  # resolved to bytes by the caller (needs bytes/token)
    else:
        raise _value_error("cpu_bytes_to_use must be specified in kv_connector_extra_config")
    chunk = int(extra.get("block_size", gpu_block))
    if chunk <= 0 or chunk % gpu_block:
        raise _value_error(f"offloaded block_size ({chunk}) must be a multiple of the GPU block_size ({gpu_block})")
    policy = str(extra.get("eviction_policy", "lru")).lower()
    if policy not in EVICTION_POLICIES:
        raise _value_error(f"Unknown eviction policy: {policy}. Supported policies: lru, arc")
    tiers: list[SecondaryTier] = []
    for t in extra.get("secondary_tiers") or []:
        if not isinstance(t, dict) or t.get("type") != "fs":
            raise _value_error(f"Unsupported secondary tier {t!r}: kvscope sim simulates type 'fs'")
        if spec != "TieringOffloadingSpec":
            raise _value_error("secondary_tiers require spec_name: TieringOffloadingSpec")
        if not t.get("root_dir"):
            raise _value_error("fs secondary tier requires root_dir")
        tiers.append(
            SecondaryTier("fs", str(t["root_dir"]), int(t.get("n_read_threads", 4)), int(t.get("n_write_threads", 4)))
        )
    return OffloadConfig(
        backend="native",
        spec_name=spec,
        cpu_bytes=cpu_bytes,
        chunk_tokens=chunk,
        eviction_policy=policy,
        store_threshold=int(extra.get("store_threshold", 0)),
        offload_prompt_only=bool(extra.get("offload_prompt_only", True)),
        secondary_tiers=tuple(tiers),
        raw=cfg,
    )


def _hybrid_lmcache_error() -> StartupError:
    return _value_error(
        "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified type."
    )


def build_config(args: argparse.Namespace) -> EngineConfig:
    try:
        profile = get_profile(args.profile)
    except KeyError as exc:
        raise StartupError(str(exc.args[0]), 2) from None
    model = profile.model
    model_path = args.model or args.model_tag or model.name
    served = (args.served_model_name or [model_path])[0]
    if not 0 < args.gpu_memory_utilization <= 1:
        raise _value_error(f"GPU memory utilization must be within (0, 1]. Got {args.gpu_memory_utilization}.")
    if args.max_num_batched_tokens < 1 or args.max_num_batched_tokens < args.max_num_seqs:
        raise _value_error(
            f"max_num_batched_tokens ({args.max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({args.max_num_seqs})."
        )
    if args.tensor_parallel_size != 1:
        raise _value_error("kvscope sim simulates one GPU: --tensor-parallel-size must be 1")

    prefix_caching = True if args.enable_prefix_caching is None else bool(args.enable_prefix_caching)
    mamba_mode = args.mamba_cache_mode or "none"
    if model.is_hybrid:
        # vLLM forces align mode and a large attention block size on hybrid models.
        mamba_mode = "align" if prefix_caching else (args.mamba_cache_mode or "none")
        block_size = model.attention_block_size or args.block_size or profile.default_block_size
    else:
        block_size = args.block_size or profile.default_block_size
    dtype = args.kv_cache_dtype
    kv_bpt = model.kv_bytes_per_token(dtype)
    bpt = model.pool_bytes_per_token(dtype, block_size)

    max_len = args.max_model_len
    derived = model.max_position_embeddings
    if max_len is None:
        max_len = min(profile.default_max_model_len, derived)
    elif max_len > derived:
        raise _value_error(
            f"User-specified max_model_len ({max_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). "
            "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    elif max_len <= 0:
        raise _value_error(f"max_model_len must be positive, got {max_len}")

    dev = profile.device
    if args.kv_cache_memory_bytes is not None:
        pool = int(args.kv_cache_memory_bytes)
    else:
        pool = int(dev.memory_total_bytes * args.gpu_memory_utilization) - model.weights_bytes - dev.non_kv_bytes
    if pool <= 0:
        raise _value_error(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine."
        )
    num_blocks = int(pool // (block_size * bpt))
    if args.num_gpu_blocks_override is not None:
        num_blocks = int(args.num_gpu_blocks_override)
    if num_blocks * block_size < max_len:
        need_gib = max_len * bpt / GIB
        have_gib = pool / GIB
        est = num_blocks * block_size
        raise _value_error(
            f"To serve at least one request with the models's max seq len ({max_len}), ({need_gib:.2f} GiB "
            f"KV cache is needed, which is larger than the available KV cache memory ({have_gib:.2f} GiB). "
            f"Based on the available memory, the estimated maximum model length is {est}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )

    offload: OffloadConfig | None = None
    if args.kv_offloading_size is not None and args.kv_transfer_config is not None:
        raise _value_error(
            "--kv-offloading-size and --kv-transfer-config are mutually exclusive: use one of them to "
            "configure KV offloading."
        )
    if args.kv_offloading_size is not None:
        if args.kv_offloading_size <= 0:
            raise _value_error(f"kv_offloading_size must be positive, got {args.kv_offloading_size}")
        if args.kv_offloading_backend == "lmcache":
            if model.is_hybrid:
                raise _hybrid_lmcache_error()
            offload = OffloadConfig(
                "lmcache", "LMCache", int(args.kv_offloading_size * GIB), block_size, "lru", 1, True
            )
        else:
            offload = OffloadConfig(
                "native", "CPUOffloadingSpec", int(args.kv_offloading_size * GIB), block_size, "lru", 0, True
            )
    elif args.kv_transfer_config is not None:
        offload = _parse_transfer_config(args.kv_transfer_config, block_size, profile)
        if offload.cpu_bytes < 0:  # given as num_cpu_blocks
            offload = _replace_bytes(offload, int(-offload.cpu_bytes * offload.chunk_tokens * bpt))
    if offload is not None and offload.cpu_bytes < offload.chunk_tokens * bpt:
        raise _value_error(
            f"CPU offloading buffer ({offload.cpu_bytes} bytes) is smaller than one offloaded block "
            f"({int(offload.chunk_tokens * bpt)} bytes)"
        )
    return EngineConfig(
        profile=profile,
        served_model_name=served,
        model_path=model_path,
        max_model_len=max_len,
        block_size=block_size,
        user_specified_block_size=args.block_size is not None,
        cache_dtype=dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        pool_bytes=pool,
        num_gpu_blocks=num_blocks,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        bytes_per_token=bpt,
        kv_bytes_per_token=kv_bpt if not model.is_hybrid else math.ceil(bpt),
        enable_prefix_caching=prefix_caching,
        mamba_cache_mode=mamba_mode,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        offload=offload,
        kv_offloading_size=args.kv_offloading_size,
        kv_offloading_backend=args.kv_offloading_backend,
        hybrid_failure=args.hybrid_failure,
        seed=args.seed,
        sim_jitter=_jitter(getattr(args, "sim_jitter", 0.0)),
    )


def _jitter(v: float) -> float:
    if not 0.0 <= v <= 0.5:  # also refuses NaN
        raise StartupError(f"--sim-jitter must be between 0 and 0.5, not {v}")
    return float(v)


def _replace_bytes(o: OffloadConfig, cpu_bytes: int) -> OffloadConfig:
    from dataclasses import replace

    return replace(o, cpu_bytes=cpu_bytes)


def make_parser(prog: str = "kvscope sim") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="A simulated vLLM OpenAI-compatible server (kvscope).")
    add_vllm_arguments(p)
    return p


def config_from_argv(argv: list[str]) -> EngineConfig:
    """Parse vLLM-style argv (tests and the calibration bench use this)."""
    return build_config(make_parser().parse_args(argv))


__all__ = ["DTYPE_BYTES", "EngineConfig", "OffloadConfig", "StartupError", "build_config", "config_from_argv"]
