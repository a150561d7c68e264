"""One request to vLLM's OpenAI completions endpoint, timed from the client.

Streaming: TTFT is the time to the first chunk carrying text, ITL the mean gap between text
chunks after it. Non-streaming: TTFT is the whole request (the field's stand-in for TTFT with a
small max_tokens) and ITL is unknown. A failure (HTTP status, timeout, broken stream) is a result
with ok=False and the reason, never an exception.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass
class RequestResult:
    tag: str  # what the request is in its workload: cold, hit, evict, reload, shared, replay, warmup ...
    ok: bool
    ttft_s: float | None = None
    itl_s: float | None = None  # mean inter-token gap of this request
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    started_at: float = 0.0  # seconds from the start of the run
    # x-kvscope-* response headers of a simulated server (its modeled timings), as sent
    server_headers: dict[str, str] = field(default_factory=dict)
    model_ttft_s: float | None = None  # the sim's modeled TTFT (whole request when not streaming), if sent

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def send_completion(
    client: httpx.Client,
    base_url: str,
    *,
    model: str | None,
    prompt: str,
    max_tokens: int,
    stream: bool,
    timeout_s: float,
    tag: str,
    clock: Callable[[], float] = time.perf_counter,
    run_t0: float | None = None,
) -> RequestResult:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if model:
        body["model"] = model
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    url = base_url.rstrip("/") + "/v1/completions"
    t0 = clock()
    res = RequestResult(tag=tag, ok=False, started_at=(t0 - run_t0) if run_t0 is not None else 0.0)
    try:
        if stream:
            with client.stream("POST", url, json=body, timeout=timeout_s) as r:
                res.status = r.status_code
                res.server_headers = _kv_headers(r.headers)
                if r.status_code != 200:
                    r.read()
                    res.error = f"HTTP {r.status_code}: {_error_text(r)}"
                    res.e2e_s = clock() - t0
                    return res
                _read_stream(r, res, t0, clock)
        else:
            r = client.post(url, json=body, timeout=timeout_s)
            res.status = r.status_code
            res.server_headers = _kv_headers(r.headers)
            res.e2e_s = clock() - t0
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {_error_text(r)}"
                return res
            data = r.json()
            res.ttft_s = res.e2e_s
            _usage(data, res)
            res.ok = True
    except httpx.TimeoutException:
        res.error = f"no answer within {timeout_s:g} s (timeout)"
        res.e2e_s = clock() - t0
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        res.e2e_s = clock() - t0
    except (ValueError, TypeError) as exc:  # garbage JSON
        res.error = f"unreadable answer: {exc}"[:300]
        res.e2e_s = clock() - t0
    if res.ok:
        # non-streaming: "TTFT" is the whole request here, so the sim's modeled whole request too
        _model_ttft(res, "x-kvscope-sim-ttft-ms" if stream else "x-kvscope-sim-e2e-ms")
    return res


def _read_stream(r: httpx.Response, res: RequestResult, t0: float, clock: Callable[[], float]) -> None:
    first: float | None = None
    last: float | None = None
    chunks = 0
    done = False
    for line in r.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            break
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        if "error" in data:
            res.error = f"stream error: {str(data['error'])[:200]}"
            res.e2e_s = clock() - t0
            return
        choices = data.get("choices") or []
        if choices and isinstance(choices[0], dict) and choices[0].get("text"):
            now = clock()
            if first is None:
                first = now
            last = now
            chunks += 1
        _usage(data, res)
    end = clock()
    res.e2e_s = end - t0
    if first is None:
        # Nothing streamed (e.g. max_tokens produced only an empty string): TTFT = whole request.
        first = end
    res.ttft_s = first - t0
    if chunks > 1 and last is not None:
        res.itl_s = (last - first) / (chunks - 1)
    if res.output_tokens is None:
        res.output_tokens = chunks
    res.ok = done or chunks > 0
    if not res.ok:
        res.error = "stream ended without data"


def _usage(data: Any, res: RequestResult) -> None:
    usage = data.get("usage") if isinstance(data, dict) else None
    if isinstance(usage, dict):
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(pt, int):
            res.prompt_tokens = pt
        if isinstance(ct, int):
            res.output_tokens = ct


def _kv_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k.lower(): v[:200] for k, v in headers.items() if k.lower().startswith("x-kvscope-")}


def _model_ttft(res: RequestResult, header: str) -> None:
    raw = res.server_headers.get(header)
    if raw is None:
        return
    try:
        v = float(raw) / 1000.0
    except ValueError:
        return
    if v > 0 and v == v and v != float("inf"):
        res.model_ttft_s = v


def _error_text(r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:200]
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:200]
    return str(data)[:200]
