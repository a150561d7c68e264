"""Reads one vLLM server: /metrics, /health, /v1/models, /version. Each source fails alone.

`/metrics` is asked with a plain Accept header (an OpenMetrics Accept header switches vLLM's
format). Other engines on the same port (SGLang, TensorRT-LLM, Dynamo KVBM, LMCache inside vLLM)
are detected from their metric names and read by agent/engines; an instance URL's fragment
(`#engine=sglang&block_size=16`, agent/engines/options.py) overrides the detection.
`/v1/models` and `/version` change only on a restart, so they are re-read every
`meta_every_s` seconds or after a restart / a failed health check, not every tick.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent import engines
from agent.engines import trtllm
from agent.engines.options import EngineOptions, split_url
from agent.fetch import Fetcher, FetchError, Reply, as_fetcher
from agent.hygiene import CounterHygiene
from kvcore.exposition import Exposition, RawSample, parse
from kvcore.normalise import KEEP_PREFIXES, Normalised, normalise
from kvcore.protocol import AgentEvent, MetricType, Sample, Scrape

SIM_HEADER = "x-kvscope-simulated"
_VALID_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "info", "unknown"})


@dataclass
class InstanceMeta:
    model: str | None = None
    model_root: str | None = None
    max_model_len: int | None = None
    version: str | None = None
    simulated: bool = False
    read_at: float | None = None


@dataclass
class VllmReader:
    base_url: str
    client: httpx.Client | Fetcher  # an httpx.Client is wrapped (tests, MockTransport)
    timeout_s: float = 2.0
    meta_every_s: float = 60.0
    keep: tuple[str, ...] = KEEP_PREFIXES + engines.KEEP_PREFIXES
    meta: InstanceMeta = field(default_factory=InstanceMeta)
    hygiene: CounterHygiene = field(init=False)
    label_cache: dict[str, dict[str, str]] = field(default_factory=dict)
    last_raw: str = ""  # the last /metrics text (for `capture`)
    options: EngineOptions = field(default_factory=EngineOptions)  # from the URL's #fragment
    detection: engines.Detection | None = None  # the engine seen at the last good scrape

    def __post_init__(self) -> None:
        self.base_url, opts = split_url(self.base_url, tuple(engines.ENGINES))
        if opts != EngineOptions():
            self.options = opts
        spec = engines.ENGINES.get(self.options.engine or "")
        self.metrics_path = self.options.metrics_path or (spec.metrics_path if spec else "/metrics")
        self.hygiene = CounterHygiene(self.base_url)
        self.fetcher = as_fetcher(self.client)

    # ------------------------------------------------------------------ one tick
    def scrape(self, now: float) -> tuple[Scrape, list[AgentEvent]]:
        events: list[AgentEvent] = []
        errors: list[str] = []
        scrape = Scrape(instance=self.base_url, ts=now, ok=False)
        simulated = False

        healthy: bool | None
        unreachable = False
        metrics_only = self._metrics_only()
        try:
            if metrics_only:  # e.g. Dynamo KVBM's own port: /metrics is all there is
                raise _Skipped
            r = self._get("/health")
            healthy = r.status_code == 200
            simulated |= r.headers.get(SIM_HEADER) == "1"
            if not healthy:
                errors.append(f"/health answered {r.status_code}")
        except _Skipped:
            healthy = None
        except FetchError as exc:
            healthy = False
            unreachable = exc.kind in ("timeout", "connect")
            errors.append(f"/health: {_describe(exc)}")
        scrape.healthy = healthy

        metrics_ok = False
        if unreachable:
            # a hung server would cost a timeout per endpoint per tick: ask again next tick
            errors.append("/metrics, /v1/models, /version: not asked (server unreachable)")
        else:
            try:
                r = self._get(self.metrics_path, accept="text/plain")
                simulated |= r.headers.get(SIM_HEADER) == "1"
                if r.status_code != 200:
                    errors.append(f"{self.metrics_path} answered {r.status_code}")
                    if metrics_only:
                        healthy = scrape.healthy = False
                else:
                    text = r.text
                    self.last_raw = text
                    exp, norm = self._read_metrics(text, errors)
                    if metrics_only:
                        healthy = scrape.healthy = True
                    samples, hyg_events = self.hygiene.apply(norm, now)
                    events.extend(hyg_events)
                    if any(e.kind == "restart" for e in hyg_events):
                        self.meta.read_at = None  # re-read model and version
                    # label dicts may be shared with the parser's cache: never mutated downstream
                    scrape.samples = [Sample(n, lab, v) for n, lab, v in samples]
                    scrape.types = {k: _mtype(v) for k, v in norm.types.items()}
                    metrics_ok = bool(samples)
                    problems = []
                    if not samples:
                        problems.append("no vLLM families in the answer (truncated, garbage, or not a vLLM server)")
                    if exp.bad_lines:
                        problems.append(f"{exp.bad_lines} unreadable line(s), first: {exp.first_error}")
                    if norm.dropped_duplicates:
                        problems.append(f"{norm.dropped_duplicates} duplicate series ignored")
                    if problems:
                        errors.append("/metrics: " + "; ".join(problems))
                    if norm.dropped_nonfinite:
                        events.append(
                            AgentEvent(
                                ts=now,
                                kind="values_dropped",
                                instance=self.base_url,
                                message=f"{norm.dropped_nonfinite} NaN/Inf sample value(s) dropped",
                                data={"count": norm.dropped_nonfinite},
                            )
                        )
            except FetchError as exc:
                errors.append(f"{self.metrics_path}: {_describe(exc)}")
                if metrics_only:
                    healthy = scrape.healthy = False

        if metrics_only:
            pass  # no /v1/models or /version to read
        elif not healthy:
            self.meta.read_at = None
        if (
            not metrics_only
            and not unreachable
            and (self.meta.read_at is None or now - self.meta.read_at >= self.meta_every_s)
        ):
            errors.extend(self._read_meta(now))
        meta = self.meta
        scrape.model, scrape.model_root, scrape.max_model_len = meta.model, meta.model_root, meta.max_model_len
        scrape.version = meta.version
        meta.simulated = meta.simulated or simulated
        scrape.simulated = meta.simulated
        scrape.ok = metrics_ok
        scrape.error = "; ".join(errors)[:2000] if errors else None
        return scrape, events

    # ------------------------------------------------------------------ engines
    def _metrics_only(self) -> bool:
        engine = self.options.engine or (self.detection.engine if self.detection else None)
        spec = engines.ENGINES.get(engine or "")
        return spec is not None and spec.metrics_only

    def _read_metrics(self, text: str, errors: list[str]) -> tuple[Exposition, Normalised]:
        """Parse, normalise, and add the engine readers' series (agent/engines)."""
        from_json: list[RawSample] = []
        if text.lstrip()[:1] in ("[", "{") and self.metrics_path == "/metrics":
            text, from_json = self._json_metrics(text, errors)
        exp = parse(text, self.keep, self.label_cache)
        norm = normalise(exp)
        norm.samples.extend(from_json)
        names = exp.types.keys() if exp.types else {n for n, _l, _v in norm.samples}
        reading = engines.read_engines(norm.samples, names, self.options.engine, self.options.block_size)
        self.detection = reading.detection
        norm.samples.extend(reading.samples)
        for fam, mtype in reading.types.items():
            norm.types.setdefault(fam, mtype)
        return exp, norm

    def _json_metrics(self, text: str, errors: list[str]) -> tuple[str, list[RawSample]]:
        """A JSON /metrics is trtllm-serve's iteration statistics: its Prometheus text is at
        /prometheus/metrics (used from now on when it answers); else the JSON's KV block stats."""
        try:
            r = self._get(trtllm.METRICS_PATH, accept="text/plain")
            if r.status_code == 200 and r.text.lstrip()[:1] not in ("[", "{"):
                self.metrics_path = trtllm.METRICS_PATH
                self.last_raw = r.text
                return r.text, []
        except FetchError:
            pass
        try:
            payload = json.loads(text)
        except ValueError:
            errors.append("/metrics: JSON that cannot be read")
            return "", []
        samples = trtllm.iteration_samples(payload)
        if not samples:
            errors.append("/metrics: JSON without TensorRT-LLM iteration statistics")
        return "", samples

    def _read_meta(self, now: float) -> list[str]:
        errors: list[str] = []
        ok = True
        try:
            r = self._get("/v1/models")
            if r.status_code == 200:
                model = _first_model(_json(r))
                if model is not None:
                    self.meta.model = _str(model.get("id"))
                    self.meta.model_root = _str(model.get("root"))
                    mml = model.get("max_model_len")
                    self.meta.max_model_len = mml if isinstance(mml, int) and not isinstance(mml, bool) else None
                else:
                    errors.append("/v1/models: no model listed")
            else:
                ok = False
                errors.append(f"/v1/models answered {r.status_code}")
        except FetchError as exc:
            ok = False
            errors.append(f"/v1/models: {_describe(exc)}")
        try:
            r = self._get("/version")
            if r.headers.get(SIM_HEADER) == "1":
                self.meta.simulated = True
            if r.status_code == 200:
                data = _json(r)
                if isinstance(data, dict):
                    self.meta.version = _str(data.get("version"))
                    if data.get("kvscope_simulated") is True:
                        self.meta.simulated = True
            else:
                ok = False
                errors.append(f"/version answered {r.status_code}")
        except FetchError as exc:
            ok = False
            errors.append(f"/version: {_describe(exc)}")
        self.meta.read_at = now if ok else None
        return errors

    def _get(self, path: str, accept: str = "*/*") -> Reply:
        return self.fetcher.get(self.base_url + path, accept, self.timeout_s)

    # ------------------------------------------------------------------ capture
    def fetch_raw(self) -> dict[str, bytes | str]:
        """The raw answers of every endpoint (or the error text), for `kvscope agent capture`."""
        out: dict[str, bytes | str] = {}
        for path, name in (
            (self.metrics_path, "metrics.prom"),
            ("/v1/models", "v1_models.json"),
            ("/version", "version.json"),
            ("/health", "health.txt"),
        ):
            try:
                r = self._get(path, accept="text/plain" if path == self.metrics_path else "*/*")
                out[name] = r.content if r.status_code == 200 else f"HTTP {r.status_code}\n{r.text[:2000]}"
            except FetchError as exc:
                out[name] = f"error: {_describe(exc)}"
        return out


class _Skipped(Exception):
    """/health is not asked of a metrics-only endpoint."""


def _describe(exc: FetchError) -> str:
    if exc.kind == "timeout":
        return "timed out"
    if exc.kind == "connect":
        return "connection refused or unreachable"
    return str(exc)[:300]


def _json(r: Reply) -> Any:
    try:
        return json.loads(r.content)
    except (ValueError, UnicodeDecodeError):
        return None


def _first_model(data: Any) -> dict[str, Any] | None:
    if isinstance(data, dict):
        models = data.get("data")
        if isinstance(models, list) and models and isinstance(models[0], dict):
            return models[0]
    return None


def _str(v: Any) -> str | None:
    return str(v)[:1024] if v is not None else None


def _mtype(v: str) -> MetricType:
    return v if v in _VALID_TYPES else "unknown"  # type: ignore[return-value]
