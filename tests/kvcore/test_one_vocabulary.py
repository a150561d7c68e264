"""Metric family names are spelled once, in the KV vocabulary: the exporter, the A/B snapshot and
the rollout probe name them by its constants; the offload hit rate has one key on the Python side
("offload") and keeps the key A/B runs were stored with ("external_hit_rate")."""

from __future__ import annotations

import re

from agent.workloads.snapshot import delta, parse_snapshot
from kvcore import kv_vocabulary as kv
from tests.paths import REPO

FAMILY = re.compile(r"['\"]vllm:[a-z]")


def test_the_exporter_the_ab_snapshot_and_the_probe_spell_no_family_name() -> None:
    files = [*(REPO / "app" / "export").rglob("*.py"), REPO / "agent" / "workloads" / "snapshot.py"]
    files.append(REPO / "agent" / "probe.py")
    assert [str(p.relative_to(REPO)) for p in files if FAMILY.search(p.read_text())] == []


def test_an_ab_run_stores_the_offload_rate_under_its_first_key() -> None:
    assert [d.run_key for d in kv.HIT_RATES] == ["gpu_hit_rate", "external_hit_rate", "overall_hit_rate"]
    before = parse_snapshot(
        f'{kv.EXT_QUERIES}{{engine="0"}} 10\n{kv.EXT_HITS}{{engine="0"}} 2\n{kv.PROMPT_TOKENS} 100\n'
    )
    after = parse_snapshot(
        f'{kv.EXT_QUERIES}{{engine="0"}} 30\n{kv.EXT_HITS}{{engine="0"}} 12\n{kv.PROMPT_TOKENS} 200\n'
    )
    d = delta(before, after, 1.0)
    assert d["external_hit_rate"] == kv.hit_rates({kv.EXT_HITS: 10.0, kv.EXT_QUERIES: 20.0}, {}).offload == 0.5
