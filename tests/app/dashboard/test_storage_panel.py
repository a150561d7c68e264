"""The overview's storage panel: what the store holds (raw samples, chunks, the database's size)
and, with KVSCOPE_STORAGE_BUDGET_MB, how much room is left."""

from __future__ import annotations

import re
from typing import Any

from app.storage.ingest_store import count_samples
from app.web.jobs import run_job_now
from tests.app.dashboard.recorded import push_all, recorded_batches

T0 = 1_800_000_000.0


def _dd(html: str, attr: str) -> int:
    found = re.search(rf'{attr}="(\d+)"', html)
    assert found, attr
    return int(found.group(1))


def test_the_overview_shows_the_raw_samples_held_and_the_room_left_in_the_budget(
    app: Any, client: Any, clock: Any, token: str
) -> None:
    ctx = app.state.ctx
    ctx.settings.dashboard.chart_cache_s = 0.0
    ctx.settings.storage.budget_mb = 50.0
    batches = recorded_batches(T0 - 1800, 120, interval=10.0)
    push_all(client, token, batches, clock)
    run_job_now(ctx, "seal_chunks", now=clock.t)
    html = client.get("/").text
    assert 'id="storage"' in html
    held = count_samples(ctx.engine)
    assert (
        _dd(html, "data-raw-samples")
        == held
        == 120 * (len(batches[0]["scrapes"][0]["samples"]) + len(batches[0]["host_samples"]))
    )
    used = _dd(html, "data-used-bytes")
    assert 0 < used < 50_000_000
    assert _dd(html, "data-room-bytes") == 50_000_000 - used
    assert "bytes/sample encoded" in html and "newest as rows" in html


def test_without_a_budget_the_panel_says_how_to_set_one(app: Any, client: Any) -> None:
    html = client.get("/").text
    assert 'id="storage"' in html and "KVSCOPE_STORAGE_BUDGET_MB" in html
