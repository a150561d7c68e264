"""From an engine's /metrics to the instance charts: the agent's reader scrapes a fake SGLang
(its real capture, counters growing), the batches go through the real ingest API, and the chart
API names the engine in every title and the tiers in the legends, with values equal to the
capture's own numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.vllm_reader import VllmReader

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
T0 = 1_800_000_000.0
STEP = 5.0
N = 40
NUMBER = re.compile(r"^(\S+(?:\{.*\})?) (\S+)$")


def scaled(text: str, k: float) -> str:
    """Cumulative values (counters, histogram parts) times k, so they grow by the capture's values
    each scrape; gauges stay the capture's."""
    out = []
    for line in text.splitlines():
        m = NUMBER.match(line)
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if line.startswith("#") or m is None or not name.endswith(("_total", "_sum", "_count", "_bucket")):
            out.append(line)
            continue
        out.append(f"{m.group(1)} {float(m.group(2)) * k!r}")
    return "\n".join(out) + "\n"


def scrapes(fixture: Path, url: str) -> list[dict[str, Any]]:
    text = fixture.read_text()
    state = {"k": 1.0}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/metrics":
            return httpx.Response(200, text=scaled(text, state["k"]))
        if req.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(404)

    reader = VllmReader(url, httpx.Client(transport=httpx.MockTransport(handler)))
    batches = []
    for i in range(N):
        state["k"] = float(i + 1)
        ts = T0 + i * STEP
        s, _ = reader.scrape(ts)
        assert s.ok, s.error
        batches.append(
            {
                "agent_id": "agent-eng",
                "host": "rig1",
                "seq": i + 1,
                "sent_at": ts,
                "scrapes": [
                    {
                        "instance": s.instance,
                        "ts": ts,
                        "ok": True,
                        "healthy": True,
                        "model": "tiny",
                        "version": "sglang",
                        "types": s.types,
                        "samples": [{"name": x.name, "labels": x.labels, "value": x.value} for x in s.samples],
                    }
                ],
            }
        )
    return batches


def chart(client: Any, key: str) -> dict[str, Any]:
    r = client.get(
        f"/api/v1/instances/1/charts/{key}",
        params={"range": "custom", "start": T0 + 60, "end": T0 + (N - 1) * STEP},
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def traces(c: dict[str, Any]) -> dict[str, list[float]]:
    assert c["figure"] is not None, c["empty"]
    return {t["name"]: [v for v in t["y"] if v is not None] for t in c["figure"]["data"] if t.get("name")}


@pytest.mark.both_databases
def test_an_sglang_instance_shows_its_engine_and_tiers_with_the_captures_numbers(
    client: Any, token: str, clock: Any
) -> None:
    for b in scrapes(FIXTURES / "sglang" / "real__sglang-0.5.23__hicache-collectors-driven.prom", "http://sgl:30000"):
        clock.t = b["sent_at"] + 0.2
        r = client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
    for key in ("tokens", "hitrates", "transfer", "tiers"):
        assert chart(client, key)["title"].endswith("· SGLang"), key

    tokens = traces(chart(client, "tokens"))
    # the capture: 1,984 host-hit and 1,920 storage-hit tokens per scrape, 5 s apart
    assert {"CPU reload", "storage reload"} <= tokens.keys()
    assert tokens["CPU reload"] and all(v == pytest.approx(1984 / STEP) for v in tokens["CPU reload"])
    assert all(v == pytest.approx(1920 / STEP) for v in tokens["storage reload"])

    hits = traces(chart(client, "hitrates"))
    cpu = next(v for name, v in hits.items() if name.startswith("CPU tier"))
    assert all(v == pytest.approx(100 * 1984 / (8512 + 1984 + 1920)) for v in cpu)
    own = next(v for name, v in hits.items() if name.startswith("SGLang as reported"))
    assert all(v == pytest.approx(100 * 0.48046875) for v in own)

    latency = chart(client, "latency")
    assert latency["figure"] is not None and latency["title"].endswith("· SGLang")  # SGLang's TTFT histogram

    tiers = traces(chart(client, "tiers"))
    assert all(v == pytest.approx(100 * 12288 / 65536) for v in tiers["CPU tier resident"])

    transfer = traces(chart(client, "transfer"))
    assert all(v == pytest.approx(1920 / STEP) for v in transfer["load storage->CPU (tokens/s)"])  # L3 -> L2


def test_a_plain_vllm_instance_keeps_its_titles(client: Any, token: str, clock: Any) -> None:
    batches = scrapes(FIXTURES / "vllm" / "real__vllm-0.32.0-cpu__tiny-llama__prefix-cache.prom", "http://v:8000")
    for b in batches[:20]:
        clock.t = b["sent_at"] + 0.2
        assert client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    r = client.get("/api/v1/instances/1/charts/tokens", params={"range": "custom", "start": T0, "end": T0 + 95})
    assert r.status_code == 200 and "·" not in r.json()["title"]


@pytest.mark.both_databases
def test_a_trtllm_instance_shows_converted_blocks_and_its_pinned_memory(client: Any, token: str, clock: Any) -> None:
    prom = FIXTURES / "trtllm" / "documented__trtllm-main-2026-collector__host-offload.prom"
    for b in scrapes(prom, "http://trt:8000"):
        clock.t = b["sent_at"] + 0.2
        assert client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    pinned = chart(client, "pinned")
    assert pinned["title"].endswith("· TensorRT-LLM")
    assert all(v == pytest.approx(0.25) for v in traces(pinned)["TensorRT-LLM pinned memory (as reported)"])
    tiers = traces(chart(client, "tiers"))
    [gpu] = [v for name, v in tiers.items() if name.startswith("GPU tier resident") and "blocks of 32 tokens" in name]
    assert all(v == pytest.approx(100 * 160 / 640) for v in gpu)
    hits = traces(chart(client, "hitrates"))
    [blocks] = [v for name, v in hits.items() if name.startswith("GPU+host tier") and "blocks of 32 tokens" in name]
    assert all(v == pytest.approx(100 * 248 / (248 + 264)) for v in blocks)
