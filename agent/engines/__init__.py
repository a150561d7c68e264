"""Readers of other engines' KV-cache metrics, one module per engine, and the registry of them.

An endpoint's engine is detected from its metric name prefixes (``vllm:``, ``sglang:``,
``trtllm_``, ``kvbm_``, ``lmcache:``), so the agent needs no flag; an override (the ``engine``
option of an instance URL, see agent/engine_options.py) wins. Every engine's families pass
through under their own names, and each reader adds normalised series in the dashboard's
vocabulary (agent/engines/kv_series.py), labelled ``kv_engine``.

The registry (ENGINES) is declared here: name, title, name prefixes, the families the agent keeps,
the metrics path, and the module's ``read`` and ``block_size``. Pure standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent.engines import kvbm, lmcache, sglang, trtllm, vllm_tiering
from agent.engines.kv_series import ENGINE_INFO, Derived, Samples, block_size_of


@dataclass(frozen=True)
class EngineSpec:
    name: str  # the kv_engine label value
    title: str  # what a chart says
    prefixes: tuple[str, ...]  # metric name prefixes that identify it
    keep: tuple[str, ...]  # families the agent keeps (besides vLLM's own, kvcore/normalise.py)
    read: Callable[[Samples, int | None], Derived]
    block_size: Callable[[Samples], float | None]
    metrics_path: str = "/metrics"
    metrics_only: bool = False  # the endpoint has no /health, /v1/models, /version
    rank: int = 0  # which detected engine is the endpoint's own (lowest); others are components


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec(
            vllm_tiering.NAME,
            vllm_tiering.TITLE,
            vllm_tiering.PREFIXES,
            vllm_tiering.KEEP,
            vllm_tiering.read,
            vllm_tiering.block_size,
            rank=0,
        ),
        EngineSpec(sglang.NAME, sglang.TITLE, sglang.PREFIXES, sglang.KEEP, sglang.read, sglang.block_size, rank=1),
        EngineSpec(
            trtllm.NAME,
            trtllm.TITLE,
            trtllm.PREFIXES,
            trtllm.KEEP,
            trtllm.read,
            trtllm.block_size,
            metrics_path=trtllm.METRICS_PATH,
            rank=2,
        ),
        EngineSpec(
            kvbm.NAME, kvbm.TITLE, kvbm.PREFIXES, kvbm.KEEP, kvbm.read, kvbm.block_size, metrics_only=True, rank=3
        ),
        EngineSpec(
            lmcache.NAME, lmcache.TITLE, lmcache.PREFIXES, lmcache.KEEP, lmcache.read, lmcache.block_size, rank=4
        ),
    )
}
# every engine's kept families, for the exposition parser's keep list
KEEP_PREFIXES: tuple[str, ...] = tuple(p for spec in ENGINES.values() for p in spec.keep)
DASHBOARD_PREFIX = "vllm:"  # the dashboard vocabulary's families (kvcore/kv_vocabulary.py)


@dataclass(frozen=True)
class Detection:
    engine: str | None  # the endpoint's own engine; None when no known prefix is seen
    components: tuple[str, ...] = ()  # other engines' families on the same endpoint (LMCache in vLLM)
    detected_by: str = "metric names"  # or "override"


def detect(names: Iterable[str], override: str | None = None) -> Detection:
    """The engines whose prefixes appear in ``names`` (metric or family names)."""
    heads = {_head(n) for n in names}
    seen = {engine for p, engine in _PREFIXES if p in heads}
    ordered = sorted(seen, key=lambda e: ENGINES[e].rank)
    if override is not None and override in ENGINES:
        return Detection(override, tuple(e for e in ordered if e != override), "override")
    if not ordered:
        return Detection(None)
    return Detection(ordered[0], tuple(ordered[1:]))


# every engine prefix is a name's head: up to its first ':' (vllm:, sglang:) or else its first '_'
_PREFIXES = [(p, spec.name) for spec in ENGINES.values() for p in spec.prefixes]


def _head(name: str) -> str:
    i = name.find(":")
    if i < 0:
        i = name.find("_")
    return name[: i + 1]


@dataclass
class EngineReading:
    detection: Detection
    block_size: int | None = None
    derived: list[Derived] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def samples(self) -> Samples:
        return [s for d in self.derived for s in d.samples]

    @property
    def types(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for d in self.derived:
            for k, v in d.types.items():
                out.setdefault(k, v)
        return out


def read_engines(
    samples: Samples,
    names: Iterable[str] | None = None,
    override: str | None = None,
    block_size: int | None = None,
) -> EngineReading:
    """Detect the endpoint's engines and run their readers on its (parsed, normalised) samples.

    ``names`` are the names detection looks at (default: the samples' own; the families of the
    exposition's TYPE lines are enough when it has them); ``block_size`` an
    operator's override of the engine's block size (tokens per block). A reader never writes the
    dashboard's ``vllm:`` families on an endpoint that has vLLM's own: they would count twice."""
    det = detect(names if names is not None else {n for n, _l, _v in samples}, override)
    reading = EngineReading(det)
    if det.engine is None:
        return reading
    own = ENGINES[det.engine]
    bs = block_size_of(block_size) if block_size is not None else block_size_of(own.block_size(samples))
    reading.block_size = bs
    has_vllm = det.engine == vllm_tiering.NAME or vllm_tiering.NAME in det.components
    for engine in (det.engine, *det.components):
        spec = ENGINES[engine]
        derived = spec.read(samples, bs if engine == det.engine else block_size_of(spec.block_size(samples)))
        if has_vllm and engine != vllm_tiering.NAME:
            kept = [s for s in derived.samples if not s[0].startswith(DASHBOARD_PREFIX)]
            if len(kept) != len(derived.samples):
                reading.notes.append(f"{spec.title}: vLLM's own token and offload families used, not {spec.title}'s")
                derived.samples = kept
                derived.types = {k: v for k, v in derived.types.items() if not k.startswith(DASHBOARD_PREFIX)}
        reading.derived.append(derived)
        reading.notes.extend(derived.notes)
    plain = det.engine == vllm_tiering.NAME and not det.components and det.detected_by != "override"
    if plain and not reading.samples:
        return reading  # vLLM without offload tiers: the dashboard's default, nothing to name
    info = Derived(det.engine)
    info.add(
        ENGINE_INFO,
        {
            "engine": own.title,
            "components": ",".join(ENGINES[c].title for c in det.components),
            "block_size": str(bs) if bs else "",
            "detected_by": det.detected_by,
        },
        1.0,
    )
    reading.derived.append(info)
    return reading
