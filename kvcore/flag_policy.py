"""Which vLLM flags a profile may carry: an allow-list, applied by the app and again by the agent.

A profile's fields render their own flags (FIELD_FLAGS). Free-form `extra_args` may only use the
flags of EXTRA_FLAGS below, each one justified: KV-cache, scheduling, memory and logging knobs
that neither load code nor change what is served or where. Everything else is refused with a
message naming the flag (`--trust-remote-code`, `--*-module-path`, `--worker-extension-cls`,
`--middleware`, plugins, `--model`, `--tokenizer`, `--host`, `--port`, `--config`, `-O`,
compilation configs ...).

Before the check, each argv item is read the way vLLM's FlexibleArgumentParser reads it:
- underscores become dashes in the name (`--kv_transfer_config` is `--kv-transfer-config`);
- `--flag=value` is the flag with an inline value;
- `--flag.key value` / `--flag.key+ value` set a key inside a JSON flag: always refused here;
- argparse's unique-prefix abbreviations (vLLM leaves `allow_abbrev` on, so
  `--kv-transfer-conf` reaches `--kv-transfer-config`): only full names are accepted, and the
  message says which flag an abbreviation would have reached;
- short options (`-O3`, `-tp 2`, `-q`, `-cc.x`) are refused: only long names are listed.

The JSON the fields render (`--kv-transfer-config`, `--kv-events-config`) is checked key by key
by the agent too (CONNECTORS): a forged command cannot name a connector module path, an
offloading spec module or an unknown connector.

This module is imported by the agent (no app dependencies) and by app/controller/profiles.py: one
definition for both. The agent is the final authority: its launcher config may widen the list
(`allow_flags = [...]`) for its own servers, and its preflight refuses anything else.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# How a flag takes its value: "bare" (no value), "int", "num" (a number) or a tuple of choices.
# "any": one value if the next item is not a flag (only for flags an agent widened the list with).
Arity = str | tuple[str, ...]

# Flags the profile's fields render. In extra_args they are refused ("set the field").
FIELD_FLAGS: dict[str, Arity] = {
    "--kv-offloading-size": "num",
    "--kv-offloading-backend": ("native", "lmcache"),
    "--kv-transfer-config": "json",
    "--kv-events-config": "json",
    "--kv-cache-dtype": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"),
    "--gpu-memory-utilization": "num",
    "--kv-cache-memory-bytes": "int",
    "--max-model-len": "int",
    "--enable-prefix-caching": "bare",
    "--no-enable-prefix-caching": "bare",
}

# extra_args: the known-safe list. None of these loads code, opens a port or a file, or changes
# which model is served, how it is tokenised, or where the server listens.
EXTRA_FLAGS: dict[str, Arity] = {
    # memory: no CUDA graphs (frees their memory, starts faster; the CPU build's usual setting)
    "--enforce-eager": "bare",
    "--no-enforce-eager": "bare",
    # KV: the GPU pool size in blocks (sizing tests, forced eviction on small rigs)
    "--num-gpu-blocks-override": "int",
    # KV: tokens per KV block (a granularity of the pool and of prefix hits)
    "--block-size": "int",
    # KV: the prefix-cache block hash (no code: a choice among vLLM's built-in hashes)
    "--prefix-caching-hash-algo": ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
    # KV observability: vLLM's own KV-cache residency metrics and their sampling rate
    "--kv-cache-metrics": "bare",
    "--no-kv-cache-metrics": "bare",
    "--kv-cache-metrics-sample": "num",
    # scheduling: how many sequences and tokens one engine step takes (they bound KV demand)
    "--max-num-seqs": "int",
    "--max-num-batched-tokens": "int",
    "--long-prefill-token-threshold": "int",
    # scheduling: chunked prefill on/off (how a long prompt shares steps with decodes)
    "--enable-chunked-prefill": "bare",
    "--no-enable-chunked-prefill": "bare",
    # scheduling: overlap scheduling with execution
    "--async-scheduling": "bare",
    "--no-async-scheduling": "bare",
    # scheduling: first-come-first-served or by request priority
    "--scheduling-policy": ("fcfs", "priority"),
    # memory: model weights partly in CPU RAM (GiB); competes with the KV pool for GPU memory
    "--cpu-offload-gb": "num",
    # logging: stats logging off, per-request log lines on/off, their length, uvicorn's level and
    # access log (no prompt or output text: --enable-log-outputs is left out for privacy)
    "--disable-log-stats": "bare",
    "--enable-log-requests": "bare",
    "--no-enable-log-requests": "bare",
    "--max-log-len": "int",
    "--uvicorn-log-level": ("critical", "debug", "error", "info", "trace", "warning"),
    "--disable-uvicorn-access-log": "bare",
    "--no-disable-uvicorn-access-log": "bare",
}

# Why some well-known flags are refused (for the message; anything not allowed is refused anyway).
REFUSED_WHY: dict[str, str] = {
    "--trust-remote-code": "runs the model repository's Python code",
    "--worker-extension-cls": "loads a class (code) into vLLM's workers",
    "--worker-cls": "loads a class (code) into vLLM's workers",
    "--scheduler-cls": "loads a class (code) as the scheduler",
    "--middleware": "loads ASGI middleware (code) into the API server",
    "--tool-parser-plugin": "loads a Python file (code) as a plugin",
    "--reasoning-parser-plugin": "loads a Python file (code) as a plugin",
    "--io-processor-plugin": "loads a plugin (code)",
    "--logits-processors": "loads classes (code) as logits processors",
    "--model-class-overrides": "replaces model classes (code)",
    "--log-config-file": "a logging config can instantiate classes (code)",
    "--model": "changes which model is served",
    "--tokenizer": "changes how prompts are tokenised (and may load code)",
    "--served-model-name": "changes what is served",
    "--hf-overrides": "changes the served model's config",
    "--revision": "changes which model is served",
    "--quantization": "changes what is served",
    "--dtype": "changes what is served",
    "--host": "changes where the server listens",
    "--port": "changes where the server listens",
    "--uds": "changes where the server listens",
    "--api-key": "changes who may use the server",
    "--allowed-origins": "changes who may use the server",
    "--root-path": "changes where the server is served",
    "--config": "reads more flags from a file",
    "--optimization-level": "compilation settings",
    "--compilation-config": "compilation settings (with paths and custom passes)",
    "--speculative-config": "loads a draft model",
    "--chat-template": "reads a template file",
    "--download-dir": "writes model files elsewhere",
    "--load-format": "changes how weights are loaded (and may load code)",
    "--model-loader-extra-config": "changes how weights are loaded",
    "--distributed-executor-backend": "may load an executor class (code)",
    "--tensor-parallel-size": "changes the process layout",
    "--pipeline-parallel-size": "changes the process layout",
    "--data-parallel-size": "changes the process layout",
    "--enable-lora": "serves adapters",
    "--lora-modules": "serves other models (adapters)",
}

# vLLM's short options and the long flags they stand for (from `vllm serve --help=all`, 0.32).
SHORT_OPTIONS: dict[str, str] = {
    "-O": "--optimization-level",
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
    "-sc": "--speculative-config",
    "-dc": "--diffusion-config",
    "-asc": "--api-server-count",
    "-ep": "--enable-expert-parallel",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-h": "--help",
}

# The connectors a profile can render into --kv-transfer-config, and the keys of their
# kv_connector_extra_config. Anything else (another connector, kv_connector_module_path, an
# offloading spec_module_path, ...) is refused: those load code.
OFFLOADING_KEYS = frozenset(
    {
        "spec_name",
        "cpu_bytes_to_use",
        "num_cpu_blocks",
        "block_size",
        "eviction_policy",
        "store_threshold",
        "offload_prompt_only",
        "secondary_tiers",
    }
)
LMCACHE_KEYS = frozenset(
    {
        "lmcache.local_cpu",
        "lmcache.max_local_cpu_size",
        "lmcache.chunk_size",
        "lmcache.local_disk",
        "lmcache.max_local_disk_size",
    }
)
CONNECTORS: dict[str, frozenset[str]] = {
    "OffloadingConnector": OFFLOADING_KEYS,
    "ExampleConnector": frozenset({"shared_storage_path"}),
    "LMCacheConnectorV1": LMCACHE_KEYS,
    "MooncakeStoreConnector": frozenset({"load_async", "enable_lookup"}),
}
TRANSFER_KEYS = frozenset({"kv_connector", "kv_role", "kv_connector_extra_config", "kv_load_failure_policy"})
EVENTS_KEYS = frozenset(
    {
        "enable_kv_cache_events",
        "publisher",
        "endpoint",
        "replay_endpoint",
        "topic",
        "buffer_steps",
        "hwm",
        "max_queue_size",
    }
)
ZMQ_ENDPOINT = re.compile(r"tcp://(\*|[A-Za-z0-9.-]{1,253}|\[[0-9a-fA-F:]{2,39}\]):([0-9]{1,5})")
IPC_ENDPOINT = re.compile(r"ipc:///[A-Za-z0-9._/-]{1,200}")
# Where KV events may go by default: loopback only (vLLM streams every prompt's block hashes and
# token ids there). `*` (vLLM binds on every interface) or another host only when widened.
LOOPBACK_HOSTS = ("127.0.0.1", "[::1]", "localhost")
DEFAULT_EVENTS_ENDPOINT = "tcp://127.0.0.1:5557"
# Where a disk / fs tier folder may be by default (vLLM writes KV files there, as the agent's user).
DEFAULT_TIER_ROOTS = ("/mnt", "/srv", "/data", "/scratch", "/tmp", "/var/tmp", "/var/cache/kvscope", "/var/lib/kvscope")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Limits:
    """Where a profile's JSON may point: kv-events hosts beyond loopback, tier folders' roots."""

    events_hosts: tuple[str, ...] = ()  # widens LOOPBACK_HOSTS ("*" lets vLLM bind on all interfaces)
    tier_roots: tuple[str, ...] = DEFAULT_TIER_ROOTS

    @classmethod
    def of(cls, events_hosts: Iterable[str] = (), tier_roots: Iterable[str] | None = None) -> Limits:
        roots = DEFAULT_TIER_ROOTS if tier_roots is None else tuple(str(r) for r in tier_roots)
        return cls(tuple(str(h) for h in events_hosts), roots)


DEFAULT_LIMITS = Limits()


def has_control(value: str) -> bool:
    """A control character (CR, LF, NUL, ESC, DEL ...): refused in flag and env values (a CR or LF
    would split a systemd unit's line or a log line)."""
    return bool(_CONTROL.search(value))


def endpoint_refusal(endpoint: Any, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """Why a kv-events endpoint is refused, or None: tcp://HOST:PORT (1024-65535) on loopback or
    a widened host, or ipc:///path."""
    text = str(endpoint)
    if IPC_ENDPOINT.fullmatch(text):
        return None
    m = ZMQ_ENDPOINT.fullmatch(text)
    if not m or not 1024 <= int(m.group(2)) <= 65535:
        return "endpoint must be tcp://HOST:PORT with a port of 1024-65535 (or ipc:///path)"
    host = m.group(1)
    if host.lower() not in {h.lower() for h in (*LOOPBACK_HOSTS, *limits.events_hosts)}:
        return (
            f"endpoint host {host} is refused: KV events carry every prompt's token ids, so only "
            f"loopback ({', '.join(LOOPBACK_HOSTS)}) or ipc:// unless kv_events_allowed_hosts widens it"
        )
    return None


def tier_path_refusal(path: Any, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """Why a disk / fs tier folder is refused, or None: absolute, no control characters, and
    (with `..` resolved) under one of the allowed roots."""
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 1024 or has_control(path):
        return "must be an absolute path (one line, under 1024 characters)"
    norm = posixpath.normpath(path)
    for root in limits.tier_roots:
        r = posixpath.normpath(str(root))
        if r == "/" or norm == r or norm.startswith(r + "/"):
            return None
    return f"{norm} is not under an allowed root ({', '.join(limits.tier_roots) or 'none'}; see tier_roots)"


_INT = re.compile(r"^[0-9]{1,15}$|^[0-9]{1,12}(\.[0-9]{1,6})?[kKmMgGtT]$")
_NUM = re.compile(r"^[0-9]{1,15}(\.[0-9]{1,12})?([eE][-+]?[0-9]{1,3})?$")
_NEGATIVE = re.compile(r"^-[0-9]+(\.[0-9]+)?$")


class FlagRefused(ValueError):
    """An argv item outside the policy; the message names the flag and why."""


@dataclass(frozen=True)
class Flag:
    """One argv item read as vLLM reads it."""

    raw: str
    name: str  # normalised: dashes, no inline value, no dotted key
    value: str | None  # the inline `=value`
    dotted: bool  # `--flag.key` / `--flag.key+` (sets a key inside a JSON flag)


def normalise(item: str) -> Flag:
    """`--kv_transfer_config=x` -> Flag(name='--kv-transfer-config', value='x'), as vLLM does."""
    key, eq, value = item.partition("=")
    base, dot, _rest = key[2:].partition(".")
    name = "--" + base.replace("_", "-")
    return Flag(item, name, value if eq else None, bool(dot))


def is_option(item: str) -> bool:
    """An item argparse reads as an option (not a value): starts with '-', not a negative number."""
    return item.startswith("-") and not _NEGATIVE.match(item)


def allowed_flags(widen: Iterable[str] = ()) -> dict[str, Arity]:
    """EXTRA_FLAGS plus an agent's (or app's) own additions, each normalised ("any" arity)."""
    out = dict(EXTRA_FLAGS)
    for w in widen:
        name = normalise(str(w).strip()).name
        if len(name) > 2:
            out.setdefault(name, "any")
    return out


def _abbreviates(name: str, known: Iterable[str]) -> list[str]:
    return sorted(k for k in known if k.startswith(name) and k != name)


def _why_refused(name: str, allowed: dict[str, Arity]) -> str:
    if name in FIELD_FLAGS:
        return f"{name} is a profile field; set the field, not extra_args"
    if name in REFUSED_WHY:
        return f"{name} is refused: it {REFUSED_WHY[name]}"
    if name.endswith("-module-path") or name.endswith("-plugin") or name.endswith("-cls"):
        return f"{name} is refused: it loads code"
    known = set(allowed) | set(FIELD_FLAGS) | set(REFUSED_WHY)
    full = _abbreviates(name, known)
    if full:
        return (
            f"{name} is an abbreviation (vLLM would read it as {' or '.join(full[:3])}); "
            "only full flag names from the allow-list are accepted"
        )
    return (
        f"{name} is not on the allow-list of extra_args flags (KV, scheduling, memory and logging "
        "flags; an agent's launcher config may widen it with allow_flags)"
    )


def _check_value(name: str, arity: Arity, value: str, limits: Limits = DEFAULT_LIMITS) -> None:
    if has_control(value):
        raise FlagRefused(f"{name}: the value has a control character (CR, LF, NUL ...); refused")
    if isinstance(arity, tuple):
        if value not in arity:
            raise FlagRefused(f"{name}: {value!r} is not one of {', '.join(arity)}")
    elif arity == "int" and not _INT.match(value):
        raise FlagRefused(f"{name}: {value!r} is not a whole number")
    elif arity == "num" and not _NUM.match(value):
        raise FlagRefused(f"{name}: {value!r} is not a number")
    elif arity == "json":
        check_json_flag(name, value, limits)
    if len(value) > 16384 or "\x00" in value or "\n" in value:
        raise FlagRefused(f"{name}: the value must be one line under 16384 characters")


def check_argv(
    argv: Sequence[str], *, allowed: dict[str, Arity], fields: bool = False, limits: Limits = DEFAULT_LIMITS
) -> None:
    """Raise FlagRefused at the first item outside the policy. `fields`: the profile's own
    flags (FIELD_FLAGS) are accepted too, with their values checked (a whole rendered argv, as
    the agent receives it); without it, the argv is a profile's extra_args."""
    i = 0
    items = [str(a) for a in argv]
    while i < len(items):
        item = items[i]
        if has_control(item):
            raise FlagRefused(f"{item[:40]!r}: a control character (CR, LF, NUL ...) is refused in flags and values")
        if not is_option(item):
            raise FlagRefused(f"{item[:80]!r} is not a --flag (a stray value: vLLM would read it as a positional)")
        if not item.startswith("--"):
            short = re.match(r"^-[A-Za-z]+", item)
            head = short.group(0) if short else item[:3]
            long = SHORT_OPTIONS.get(head) or next((v for k, v in SHORT_OPTIONS.items() if head.startswith(k)), None)
            reads = f" (vLLM reads it as {long})" if long else ""
            raise FlagRefused(f"{head} is a short option{reads}; only full --flag names from the allow-list")
        if item == "--":
            raise FlagRefused("-- (end of options) is refused: everything after it would be a positional")
        flag = normalise(item)
        if flag.dotted:
            raise FlagRefused(
                f"{flag.raw.split('=', 1)[0][:80]} sets a key inside {flag.name}: the dotted JSON form is refused"
            )
        arity = FIELD_FLAGS.get(flag.name) if fields else None
        if arity is None:
            arity = allowed.get(flag.name)
        if arity is None:
            raise FlagRefused(_why_refused(flag.name, allowed))
        i += 1
        if arity == "bare":
            if flag.value is not None:
                raise FlagRefused(f"{flag.name} takes no value")
            continue
        if flag.value is not None:
            value = flag.value
        elif i < len(items) and not is_option(items[i]):
            value = items[i]
            i += 1
        elif arity == "any":
            continue
        else:
            raise FlagRefused(f"{flag.name} needs a value")
        _check_value(flag.name, arity, value, limits)


def refusal(
    argv: Sequence[str], *, allowed: dict[str, Arity], fields: bool = False, limits: Limits = DEFAULT_LIMITS
) -> str | None:
    """The refusal message for an argv, or None when it passes."""
    try:
        check_argv(argv, allowed=allowed, fields=fields, limits=limits)
    except FlagRefused as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------- the JSON flags
def check_json_flag(name: str, raw: str, limits: Limits = DEFAULT_LIMITS) -> None:
    try:
        cfg = json.loads(raw)
    except ValueError:
        raise FlagRefused(f"{name}: not valid JSON") from None
    if not isinstance(cfg, dict):
        raise FlagRefused(f"{name}: expected a JSON object")
    if name == "--kv-transfer-config":
        check_transfer_config(cfg, limits)
    elif name == "--kv-events-config":
        check_events_config(cfg, limits)
    else:
        raise FlagRefused(f"{name}: JSON values are refused")


def check_transfer_config(cfg: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> None:
    if "kv_connector_module_path" in cfg:
        raise FlagRefused("--kv-transfer-config: kv_connector_module_path is refused (it loads code)")
    extra_keys = sorted(set(cfg) - TRANSFER_KEYS)
    if extra_keys:
        raise FlagRefused(f"--kv-transfer-config: key(s) {', '.join(extra_keys)} refused")
    connector = cfg.get("kv_connector")
    if connector not in CONNECTORS:
        raise FlagRefused(
            f"--kv-transfer-config: connector {connector!r} refused (one of {', '.join(sorted(CONNECTORS))})"
        )
    if cfg.get("kv_role") != "kv_both":
        raise FlagRefused("--kv-transfer-config: kv_role must be kv_both")
    if cfg.get("kv_load_failure_policy", "fail") not in ("fail", "recompute"):
        raise FlagRefused("--kv-transfer-config: kv_load_failure_policy must be fail or recompute")
    extra = cfg.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise FlagRefused("--kv-transfer-config: kv_connector_extra_config must be an object")
    odd = sorted(set(extra) - CONNECTORS[connector])
    if odd:
        raise FlagRefused(f"--kv-transfer-config: {connector} key(s) {', '.join(odd)} refused")
    for key, value in extra.items():
        if isinstance(value, dict):
            raise FlagRefused(f"--kv-transfer-config: {key} must not be an object")
    if connector == "OffloadingConnector":
        spec = extra.get("spec_name", "CPUOffloadingSpec")
        if spec not in ("CPUOffloadingSpec", "TieringOffloadingSpec"):
            raise FlagRefused(f"--kv-transfer-config: spec_name {spec!r} refused")
        tiers = extra.get("secondary_tiers") or []
        if not isinstance(tiers, list) or any(not _fs_tier_ok(t) for t in tiers):
            raise FlagRefused("--kv-transfer-config: secondary_tiers must be fs tiers {type, root_dir, threads}")
        for t in tiers:
            why = tier_path_refusal(t.get("root_dir"), limits)
            if why:
                raise FlagRefused(f"--kv-transfer-config: secondary_tiers root_dir {why}")
    for key in ("shared_storage_path",):
        if key in extra:
            why = tier_path_refusal(extra[key], limits)
            if why:
                raise FlagRefused(f"--kv-transfer-config: {key} {why}")
    disk = extra.get("lmcache.local_disk")
    if disk is not None and not (isinstance(disk, str) and _abs_path(disk.removeprefix("file://"))):
        raise FlagRefused("--kv-transfer-config: lmcache.local_disk must be file:///an/absolute/path")
    if isinstance(disk, str):
        why = tier_path_refusal(disk.removeprefix("file://"), limits)
        if why:
            raise FlagRefused(f"--kv-transfer-config: lmcache.local_disk {why}")


def _abs_path(v: Any) -> bool:
    return isinstance(v, str) and v.startswith("/") and len(v) <= 1024 and "\x00" not in v


def _fs_tier_ok(t: Any) -> bool:
    return (
        isinstance(t, dict)
        and set(t) <= {"type", "root_dir", "n_read_threads", "n_write_threads"}
        and t.get("type") == "fs"
        and _abs_path(t.get("root_dir"))
    )


def check_events_config(cfg: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> None:
    odd = sorted(set(cfg) - EVENTS_KEYS)
    if odd:
        raise FlagRefused(f"--kv-events-config: key(s) {', '.join(odd)} refused")
    if cfg.get("publisher", "zmq") not in ("zmq", "null"):
        raise FlagRefused("--kv-events-config: publisher must be zmq or null")
    # vLLM's own default endpoint is tcp://*:5557 (all interfaces): an absent one is checked as that
    why = endpoint_refusal(cfg.get("endpoint", "tcp://*:5557"), limits)
    if why:
        raise FlagRefused(f"--kv-events-config: {why}")
    if cfg.get("replay_endpoint") is not None:  # vLLM binds its replay (ROUTER) socket: same hosts
        why = endpoint_refusal(cfg["replay_endpoint"], limits)
        if why:
            raise FlagRefused(f"--kv-events-config: replay_{why}")
    if not isinstance(cfg.get("topic", ""), str) or len(cfg.get("topic", "")) > 128:
        raise FlagRefused("--kv-events-config: topic must be a string under 128 characters")
