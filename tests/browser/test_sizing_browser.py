"""The sizing page in real headless Chromium: the CPU-tier curve with the headroom line, the fp8
what-if, the other levers and the host split, the operator's buttons, and a clean console
(simulated stream pushed through the real ingest API)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.sizing.simwindows import BASE, recorded_run, window_dict
from tests.browser.conftest import LiveApp

pytestmark = [pytest.mark.browser]
GIB = float(1 << 30)
URL = "http://127.0.0.1:8000"
SCREENSHOTS = os.environ.get("KVSCOPE_SCREENSHOTS_DIR")


def _batch(seq: int, ts: float, labels: dict[str, str], reuse: list[dict[str, Any]] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": "agent-1",
        "host": "rig1",
        "seq": seq,
        "sent_at": ts,
        "scrapes": [
            {
                "instance": URL,
                "ts": ts,
                "ok": True,
                "healthy": True,
                "model": "m",
                "version": "0.32.0",
                "simulated": True,
                "types": {"vllm:cache_config_info": "gauge", "vllm:prompt_tokens": "counter"},
                "samples": [
                    {"name": "vllm:cache_config_info", "labels": labels, "value": 1.0},
                    {"name": "vllm:prompt_tokens_total", "labels": {"engine": "0"}, "value": 1000.0 * seq},
                ],
            }
        ],
        "host_ts": ts,
        "host_samples": [
            {"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": 5.2 * GIB},
            {"name": "kvscope:host_memory_total_bytes", "labels": {}, "value": 64 * GIB},
        ],
        "host_types": {"kvscope:host_memory_available_bytes": "gauge", "kvscope:host_memory_total_bytes": "gauge"},
    }
    if reuse:
        body["reuse"] = reuse
    return body


@pytest.fixture(scope="module")
def live(tmp_path_factory: Any, chromium_context: Any) -> Iterator[LiveApp]:
    app = LiveApp(tmp_path_factory.mktemp("browser-sizing"))
    app.start()
    app.login(chromium_context, role="operator")
    try:
        e, rec, _m = recorded_run(*BASE)
        labels = e.cfg.cache_config_labels()
        now = time.time()
        with httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {app.token}"}) as c:
            for seq, ts, reuse in ((1, now - 60, None), (2, now - 1, [window_dict(URL, rec, 16, now - 60, now - 1)])):
                r = c.post("/api/v1/ingest", json=_batch(seq, ts, labels, reuse))
                assert r.status_code == 200, r.text
        yield app
    finally:
        app.stop()


def test_the_sizing_page_shows_the_curve_every_lever_and_the_host_split(live: LiveApp, page: Any) -> None:
    p, log = page
    p.goto(f"{live.url}/instances/1/sizing", wait_until="networkidle")
    assert p.locator("svg.sizing-curve polyline.curve").count() == 1
    assert p.locator("svg.sizing-curve line.headroom").count() == 1  # 2 GiB of headroom: the curve stops there
    assert "Suggested CPU tier" in p.locator("#suggestion").inner_text()
    assert "--kv-cache-dtype fp8" in p.locator("#fp8-what-if").inner_text()
    assert p.locator("#larger-pool tr").count() == 4
    assert "A disk tier behind the CPU tier" in p.locator("#disk-tier").inner_text()
    assert p.locator("#host-split tr").count() == 2
    assert p.get_by_role("button", name="A/B current vs suggested").is_visible()
    assert p.get_by_role("button", name="Apply this size (review first)").is_visible()
    box = p.locator("svg.sizing-curve").bounding_box()
    assert box is not None and box["width"] > 300
    if SCREENSHOTS:
        p.screenshot(path=str(Path(SCREENSHOTS) / "sizing-browser.png"), full_page=True)
    assert log.errors == []
