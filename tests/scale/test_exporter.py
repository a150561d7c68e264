"""The app's /metrics exports derived per-instance series (stable names), on SQLite and Postgres."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.derived.series_reader import TieredSeries
from app.export.exporter import METRIC_NAMES, METRICS, derive
from tests.conftest import api_token

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
OFFLOAD_CFG = {"model_name": "qwen", "block_size": "16", "kv_offloading_size": "8", "engine": "0"}


def _scrape_body(
    seq: int, ts: float, *, host: str = "rig1", instance: str = "http://127.0.0.1:8000", t: float
) -> dict[str, Any]:
    """Counters growing at known rates: t is seconds since the start."""
    lab = {"model_name": "qwen", "engine": "0"}
    vals = [
        ("vllm:prefix_cache_queries_total", lab, 1000.0 * t),
        ("vllm:prefix_cache_hits_total", lab, 600.0 * t),  # GPU hit ratio 0.6
        ("vllm:external_prefix_cache_queries_total", lab, 400.0 * t),
        ("vllm:external_prefix_cache_hits_total", lab, 100.0 * t),  # offload hit ratio 0.25
        ("vllm:prompt_tokens_total", lab, 1000.0 * t),
        ("vllm:prompt_tokens_cached_total", lab, 700.0 * t),  # overall 0.7
        ("vllm:prompt_tokens_by_source_total", {**lab, "source": "local_compute"}, 300.0 * t),
        ("vllm:prompt_tokens_by_source_total", {**lab, "source": "local_cache_hit"}, 600.0 * t),
        ("vllm:prompt_tokens_by_source_total", {**lab, "source": "external_kv_transfer"}, 100.0 * t),
        ("vllm:kv_offload_load_bytes_total", lab, 100.0 * 147_456 * t),
        ("vllm:kv_offload_load_time_total", lab, 0.00125 * t),  # 14.7 MB/s average, 11.8 GB/s while moving
        ("vllm:kv_offload_store_bytes_total", lab, 2e8 * t),
        ("vllm:kv_offload_store_time_total", lab, 0.02 * t),
        ("vllm:kv_cache_usage_perc", lab, 0.42),
        ("vllm:num_requests_running", lab, 3.0),
        ("vllm:cache_config_info", OFFLOAD_CFG, 1.0),
    ]
    return {
        "agent_id": f"agent-{host}",
        "host": host,
        "seq": seq,
        "sent_at": ts,
        "scrapes": [
            {
                "instance": instance,
                "ts": ts,
                "ok": True,
                "healthy": True,
                "model": "qwen",
                "simulated": True,
                "types": {
                    "vllm:prefix_cache_queries": "counter",
                    "vllm:prefix_cache_hits": "counter",
                    "vllm:kv_cache_usage_perc": "gauge",
                    "vllm:num_requests_running": "gauge",
                    "vllm:cache_config_info": "gauge",
                },
                "samples": [{"name": n, "labels": la, "value": v} for n, la, v in vals],
            }
        ],
        "host_ts": ts,
        "host_types": {},
        "host_samples": [
            {
                "name": "kvscope:pinned_offload_file_bytes",
                "labels": {"file": "/dev/shm/vllm_offload_0.mmap"},
                "value": 8.0 * GIB,
            },
            {
                "name": "kvscope:pinned_offload_resident_bytes",
                "labels": {"file": "/dev/shm/vllm_offload_0.mmap"},
                "value": 6.0 * GIB,
            },
            {"name": "kvscope:pinned_vllm_rss_shmem_bytes", "labels": {"pid": "123"}, "value": 6.5 * GIB},
            {"name": "kvscope:cgroup_memory_limit_bytes", "labels": {}, "value": 32.0 * GIB},
            {"name": "kvscope:cgroup_memory_current_bytes", "labels": {}, "value": 20.0 * GIB},
            {"name": "kvscope:host_memory_total_bytes", "labels": {}, "value": 64.0 * GIB},
            {"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": 40.0 * GIB},
        ],
    }


def _push(client: Any, token: str, body: dict[str, Any]) -> None:
    r = client.post(
        "/api/v1/ingest",
        content=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text


def _exported(client: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = client.get("/metrics")
    assert r.status_code == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _one(got: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> float:
    hits = [v for labels, v in got.get(name, []) if all(labels.get(k) == val for k, val in match.items())]
    assert len(hits) == 1, (name, match, got.get(name))
    return hits[0]


def test_metrics_export_derived_series(client: Any, token: str, clock: Any) -> None:
    t0 = clock()
    for i in range(13):  # 5 s apart: one minute of pushes
        clock.t = t0 + 5 * i
        _push(client, token, _scrape_body(i + 1, clock.t, t=5.0 * i))
    got = _exported(client)
    inst = {"host": "rig1", "vllm_url": "http://127.0.0.1:8000"}
    assert _one(got, "kvscope_instance_up", **inst) == 1.0
    assert _one(got, "kvscope_instance_stale", **inst) == 0.0
    labels = next(la for la, _ in got["kvscope_instance_up"])
    assert labels["model"] == "qwen" and labels["simulated"] == "true" and labels["instance_id"]
    assert _one(got, "kvscope_instance_gpu_prefix_cache_hit_ratio", **inst) == pytest.approx(0.6)
    assert _one(got, "kvscope_instance_offload_hit_ratio", **inst) == pytest.approx(0.25)
    assert _one(got, "kvscope_instance_prompt_cache_hit_ratio", **inst) == pytest.approx(0.7)
    for src, rate in (("local_compute", 300.0), ("local_cache_hit", 600.0), ("external_kv_transfer", 100.0)):
        assert _one(got, "kvscope_instance_prompt_tokens_per_second", source=src, **inst) == pytest.approx(rate)
    assert _one(got, "kvscope_instance_kv_offload_bytes_per_second", direction="load", **inst) == pytest.approx(
        14_745_600.0
    )
    assert _one(
        got, "kvscope_instance_kv_offload_transfer_bytes_per_second", direction="load", **inst
    ) == pytest.approx(14_745_600.0 / 0.00125)
    assert _one(
        got, "kvscope_instance_kv_offload_transfer_bytes_per_second", direction="store", **inst
    ) == pytest.approx(1e10)
    assert _one(got, "kvscope_instance_kv_cache_usage_ratio", **inst) == pytest.approx(0.42)
    assert _one(got, "kvscope_instance_requests", state="running", **inst) == 3.0
    assert _one(got, "kvscope_instance_offload_configured_bytes", **inst) == 8.0 * GIB
    assert _one(got, "kvscope_host_pinned_bytes", host="rig1", kind="offload_file") == 8.0 * GIB
    assert _one(got, "kvscope_host_pinned_bytes", host="rig1", kind="offload_resident") == 6.0 * GIB
    assert _one(got, "kvscope_host_pinned_bytes", host="rig1", kind="vllm_rss_shmem") == 6.5 * GIB
    assert _one(got, "kvscope_host_memory_limit_bytes", host="rig1", basis="cgroup") == 32.0 * GIB
    assert _one(got, "kvscope_host_memory_headroom_bytes", host="rig1", basis="cgroup") == 12.0 * GIB
    assert _one(got, "kvscope_host_last_push_age_seconds", host="rig1") == 0.0
    assert _one(got, "kvscope_exporter_window_seconds") == 60.0
    # The app's own metrics are still there.
    assert "kvscope_ingest_samples_total" in got

    # The agent goes silent: the instance is stale, no stale rates are exported.
    clock.advance(120.0)
    got = _exported(client)
    assert _one(got, "kvscope_instance_stale", **inst) == 1.0
    assert _one(got, "kvscope_instance_up", **inst) == 0.0
    assert "kvscope_instance_gpu_prefix_cache_hit_ratio" not in got
    assert "kvscope_host_pinned_bytes" not in got
    assert _one(got, "kvscope_host_last_push_age_seconds", host="rig1") == pytest.approx(120.0)


def test_counter_reset_never_exports_a_negative_rate(client: Any, token: str, clock: Any) -> None:
    t0 = clock()
    ts = [0.0, 5.0, 10.0, 15.0, 20.0]
    for i, t in enumerate(ts):
        clock.t = t0 + t
        # vLLM restarts after 10 s: counters start again from 0
        body = _scrape_body(i + 1, clock.t, t=t if t <= 10 else t - 15.0 + 0.001)
        _push(client, token, body)
    got = _exported(client)
    for name in ("kvscope_instance_prompt_tokens_per_second", "kvscope_instance_kv_offload_bytes_per_second"):
        assert got[name] and all(v >= 0 for _, v in got[name]), got[name]
    for name in ("kvscope_instance_gpu_prefix_cache_hit_ratio", "kvscope_instance_offload_hit_ratio"):
        assert all(0.0 <= v <= 1.0 for _, v in got[name])


def test_names_are_stable() -> None:
    """The names are a contract with users' dashboards: docs and the Grafana JSON use them."""
    assert all(n.startswith("kvscope_") for n in METRIC_NAMES)
    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES)
    doc = (REPO / "docs" / "scale.md").read_text()
    for n in METRIC_NAMES:
        assert n in doc, f"{n} is not documented in docs/scale.md"
    dash = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exprs = " ".join(t.get("expr", "") for p in dash["panels"] for t in p.get("targets", []))
    used = {n for n in METRIC_NAMES if n in exprs}
    assert used, "the Grafana dashboard uses no exported metric"
    known = set(METRIC_NAMES) | {"kvscope_ingest_samples_total"}
    import re

    for name in set(re.findall(r"kvscope_[a-z_]+", exprs)):
        assert name in known, f"the Grafana dashboard queries {name}, which kvscope does not export"
    assert {m.name for m in METRICS} >= {
        "instance_gpu_prefix_cache_hit_ratio",
        "instance_prompt_tokens_per_second",
        "instance_kv_offload_transfer_bytes_per_second",
        "host_pinned_bytes",
        "host_memory_headroom_bytes",
    }


def test_derive_without_data_exports_only_state() -> None:
    now = 1000.0
    inst = {
        "id": 1,
        "host_id": 1,
        "host": "h",
        "url": "http://x:8000",
        "model": None,
        "simulated": False,
        "host_last_push": now - 1,
        "last_ok": now - 1,
        "last_scrape": now - 1,
        "healthy": True,
        "cache_config": {"kv_offloading_size": "None"},
    }
    out = derive([inst], [], now, 60.0, 30.0)
    names = sorted({n for n, _, _ in out})
    assert names == [
        "exporter_window_seconds",
        "host_last_push_age_seconds",
        "instance_gone",
        "instance_stale",
        "instance_up",
    ]
    # One point per series is not a rate: nothing is made up.
    one = [
        TieredSeries(1, "vllm:prefix_cache_hits_total", {}, "counter", "raw", 0.0, [(now - 1, 5.0)], [], 1, 1),
        TieredSeries(2, "vllm:prefix_cache_queries_total", {}, "counter", "raw", 0.0, [(now - 1, 9.0)], [], 1, 1),
    ]
    assert "instance_gpu_prefix_cache_hit_ratio" not in {n for n, _, _ in derive([inst], one, now, 60.0, 30.0)}
    # No queries in the window: no ratio (not 0 %).
    flat = [
        TieredSeries(
            1, "vllm:prefix_cache_hits_total", {}, "counter", "raw", 0.0, [(now - 10, 5.0), (now, 5.0)], [], 1, 1
        ),
        TieredSeries(
            2, "vllm:prefix_cache_queries_total", {}, "counter", "raw", 0.0, [(now - 10, 9.0), (now, 9.0)], [], 1, 1
        ),
    ]
    assert "instance_gpu_prefix_cache_hit_ratio" not in {n for n, _, _ in derive([inst], flat, now, 60.0, 30.0)}


def test_exporter_can_be_turned_off(engine: Any, clock: Any, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    s = load_settings(None, data_dir=str(tmp_path / "off"), run_scheduler=False, exporter_enabled=False)
    with TestClient(create_app(s, engine=engine, clock=clock, start_jobs=False)) as c:
        text = c.get("/metrics", headers={"Authorization": "Bearer " + api_token(engine, "viewer")}).text
    assert "kvscope_ingest_samples_total" in text and "kvscope_instance_up" not in text
