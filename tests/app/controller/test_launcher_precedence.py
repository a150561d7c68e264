"""Rollout settings: a rollout's own value > the instance's launcher config > the app's defaults.
The app used to send its defaults as if a rollout had set them, so a launcher config's
per-instance health_deadline_s and probe never took effect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.controller import load_config
from app.controller.rollouts import build_payload

APP_DEFAULTS: dict[str, Any] = {
    "health_deadline_s": 900.0,
    "probe": {"enabled": True, "prefix_words": 2000, "evict_count": 8, "request_timeout_s": 120.0},
}


def _instances(tmp_path: Path, extra: str) -> Any:
    cfg = tmp_path / "launcher.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path / "st"}"\n[[instance]]\nurl = "http://127.0.0.1:8101"\n'
        f'command = ["kvscope", "sim", "--port", "8101"]\nstart = false\n{extra}'
    )
    (inst,), _ = load_config(cfg)
    return inst


def test_the_launcher_configs_per_instance_settings_win_over_the_apps_defaults(tmp_path: Path) -> None:
    inst = _instances(tmp_path, "health_deadline_s = 45\nprobe = { prefix_words = 300, enabled = true }\n")
    payload = {"defaults": APP_DEFAULTS}
    assert inst.deadline_for(payload) == 45.0
    probe = inst.probe_for(payload)
    assert probe is not None and probe["prefix_words"] == 300 and probe["evict_count"] == 8


def test_a_rollout_that_sets_them_explicitly_wins(tmp_path: Path) -> None:
    inst = _instances(tmp_path, "health_deadline_s = 45\nprobe = { prefix_words = 300 }\n")
    payload = {"defaults": APP_DEFAULTS, "health_deadline_s": 20, "probe": {"prefix_words": 2900}}
    assert inst.deadline_for(payload) == 20.0
    assert inst.probe_for(payload) == {**APP_DEFAULTS["probe"], "prefix_words": 2900}
    assert inst.probe_for({**payload, "probe": False}) is None


def test_without_launcher_settings_the_apps_defaults_apply_and_garbage_is_ignored(tmp_path: Path) -> None:
    inst = _instances(tmp_path, "")
    assert inst.deadline_for({"defaults": APP_DEFAULTS}) == 900.0
    assert inst.deadline_for({"defaults": {"health_deadline_s": "soon"}, "health_deadline_s": -1}) == 300.0
    assert inst.deadline_for({"health_deadline_s": float("inf")}) == 300.0
    off = {"defaults": {**APP_DEFAULTS, "probe": {**APP_DEFAULTS["probe"], "enabled": False}}}
    assert inst.probe_for(off) is None  # the app's default says no probe, and nothing overrides it


def test_the_app_sends_its_defaults_apart_from_explicit_settings(app: Any) -> None:
    from app.controller.profiles import parse_profile

    ctx = app.state.ctx
    payload = build_payload(
        ctx,
        parse_profile("p", {"kv_cache_dtype": "fp8"}),
        {"id": 1, "version": 1},
        None,
        override_hybrid=False,
        model_root=None,
    )
    assert "health_deadline_s" not in payload and "probe" not in payload
    assert payload["defaults"]["health_deadline_s"] == ctx.settings.controller.health_deadline_s
    assert payload["defaults"]["probe"]["prefix_words"] == ctx.settings.controller.probe_prefix_words
