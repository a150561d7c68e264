"""Issue 29, controller inputs: where a profile's JSON may point (kv-events hosts, tier folders),
control characters in flag values, HTML in agent labels (script blocks, Plotly legends)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.controller import load_config
from agent.preflight_policy import check_flag_policy
from app.controller.profiles import ProfileError, parse_profile
from kvcore import flag_policy


def _events_argv(endpoint: str) -> list[str]:
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "t"}
    return ["--kv-events-config", json.dumps(cfg)]


def _disk_argv(path: str) -> list[str]:
    cfg = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": path},
    }
    return ["--kv-transfer-config", json.dumps(cfg)]


# ------------------------------------------------------------------ 7: kv-events endpoint hosts
@pytest.mark.parametrize("endpoint", ["tcp://evil.example.com:5557", "tcp://10.0.0.5:5557", "tcp://*:5557"])
def test_a_kv_events_endpoint_off_loopback_is_refused_by_the_app_and_the_agent(endpoint: str) -> None:
    with pytest.raises(ProfileError, match="loopback"):
        parse_profile("ev", {"kv_events": {"endpoint": endpoint}})
    check = check_flag_policy(_events_argv(endpoint), [])
    assert check.status == "refuse" and "loopback" in check.message


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:5557", "tcp://[::1]:5557", "tcp://localhost:5557", "ipc:///tmp/kv-events"]
)
def test_a_loopback_or_ipc_kv_events_endpoint_passes_both_checks(endpoint: str) -> None:
    argv = parse_profile("ev", {"kv_events": {"endpoint": endpoint}}).to_argv()
    assert check_flag_policy(argv, []).status == "pass"


def test_the_default_kv_events_endpoint_is_loopback() -> None:
    argv = parse_profile("ev", {"kv_events": {}}).to_argv()
    cfg = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert cfg["endpoint"] == "tcp://127.0.0.1:5557"
    assert check_flag_policy(argv, []).status == "pass"


def test_the_apps_kv_events_allowed_hosts_setting_widens_the_hosts(client: Any, app: Any) -> None:
    body = {"name": "ev", "spec": {"kv_events": {"endpoint": "tcp://*:5557"}}}
    r = client.post("/api/v1/profiles", json=body)
    assert r.status_code == 422 and "loopback" in r.text
    app.state.ctx.settings.controller.kv_events_allowed_hosts = ["*"]
    r = client.post("/api/v1/profiles", json=body)
    assert r.status_code == 201, r.text
    assert client.get("/api/v1/profiles/ev").json()["error"] is None


def test_the_agents_launcher_config_widens_the_kv_events_hosts_for_its_own_servers(tmp_path: Path) -> None:
    cfg = tmp_path / "launch.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path}"\n[[instance]]\nurl = "http://127.0.0.1:8001"\n'
        'command = ["vllm", "serve", "m"]\nkv_events_allowed_hosts = ["*"]\n'
    )
    instances, _data = load_config(cfg)
    argv = _events_argv("tcp://*:5557")
    assert check_flag_policy(argv, [], (), instances[0].policy_limits).status == "pass"
    assert check_flag_policy(argv, []).status == "refuse"


def test_the_profile_page_says_kv_events_are_loopback_only(client: Any) -> None:
    page = client.get("/profiles")
    assert page.status_code == 200 and "Loopback only" in page.text and "kv_events_allowed_hosts" in page.text


# ------------------------------------------------------------------ 20: a trailing newline
def test_a_kv_events_endpoint_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ProfileError):
        parse_profile("ev", {"kv_events": {"endpoint": "tcp://127.0.0.1:5557\n"}})
    assert flag_policy.endpoint_refusal("tcp://127.0.0.1:5557\n") is not None
    assert check_flag_policy(_events_argv("tcp://127.0.0.1:5557\n"), []).status == "refuse"


# ------------------------------------------------------------------ 11: tier folders
BAD_TIER_PATHS = ["/etc/cron.d", "/root/.ssh", "/proc/self", "/mnt/../etc/cron.d", "/tmp/../../root/.ssh"]


@pytest.mark.parametrize("path", BAD_TIER_PATHS)
def test_a_tier_folder_outside_the_allowed_roots_is_refused_by_the_app(path: str) -> None:
    for spec in (
        {"disk_tier": {"shared_storage_path": path}},
        {"offload_size_gib": 2, "offload_spec": "tiering", "fs_tier": {"root_dir": path}},
        {"lmcache": {"local_disk": path}},
    ):
        with pytest.raises(ProfileError, match="not under an allowed root"):
            parse_profile("disk", spec)


@pytest.mark.parametrize("path", BAD_TIER_PATHS)
def test_a_tier_folder_outside_the_allowed_roots_is_refused_by_the_agent(path: str) -> None:
    check = check_flag_policy(_disk_argv(path), [])
    assert check.status == "refuse" and "not under an allowed root" in check.message


def test_a_tier_folder_under_an_allowed_root_passes_and_the_roots_are_settings(client: Any, app: Any) -> None:
    argv = parse_profile("disk", {"disk_tier": {"shared_storage_path": "/mnt/kv"}}).to_argv()
    assert check_flag_policy(argv, []).status == "pass"
    body = {"name": "disk", "spec": {"disk_tier": {"shared_storage_path": "/opt/kv"}}}
    assert client.post("/api/v1/profiles", json=body).status_code == 422
    app.state.ctx.settings.controller.tier_roots = ["/opt/kv"]
    r = client.post("/api/v1/profiles", json=body)
    assert r.status_code == 201, r.text
    narrow = flag_policy.Limits.of((), ["/opt/kv"])
    assert check_flag_policy(_disk_argv("/mnt/kv"), [], (), narrow).status == "refuse"
    assert check_flag_policy(_disk_argv("/opt/kv/a"), [], (), narrow).status == "pass"


# ------------------------------------------------------------------ 19: control characters
@pytest.mark.parametrize("ch", ["\r", "\x00", "\x1b", "\x7f", "\t"])
def test_a_control_character_in_a_flag_value_is_refused_by_the_agent_and_the_app(ch: str) -> None:
    check = check_flag_policy(["--max-log-len", "100", "--max-num-seqs", f"4{ch}"], [])
    assert check.status == "refuse" and "control character" in check.message
    with pytest.raises(ProfileError, match="control character"):
        parse_profile("cr", {"extra_args": ["--max-num-seqs", f"4{ch}"]})
    with pytest.raises(ProfileError):
        parse_profile("cr", {"disk_tier": {"shared_storage_path": f"/mnt/kv{ch}"}})


# ------------------------------------------------------------------ 10, 17: HTML in agent labels
SCRIPT_OPENER = "<!--<script>"
LINK = '<a href="http://evil">x</a>'


def _push_labelled(client: Any, token: str, clock: Any, batch_factory: Any, label: str) -> None:
    """An instance whose model and host GPU carry `label` (what a hostile agent may report)."""
    t = clock()
    for seq in range(1, 8):
        b = batch_factory(
            seq, t - 60 + seq * 5, samples=[("vllm:prompt_tokens_total", {"model_name": label}, 100.0 * seq)]
        )
        b["scrapes"][0]["model"] = label
        b["host_ts"] = b["sent_at"]
        b["host_samples"] = [
            {"name": "kvscope:gpu_count", "labels": {}, "value": 1.0},
            {"name": "kvscope:gpu_memory_used_bytes", "labels": {"gpu": label}, "value": 1e9 * seq},
        ]
        r = client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
    clock.t = t + 2


def _scripts(html: str) -> list[str]:
    return re.findall(r"<script[^>]*>(.*?)</script>", html, re.S)


def test_a_label_opening_a_script_comment_cannot_reach_a_pages_script_block(
    client: Any, token: str, clock: Any, batch_factory: Any
) -> None:
    _push_labelled(client, token, clock, batch_factory, SCRIPT_OPENER + "</script>")
    page = client.get("/instances/1?range=15m").text
    page += client.get("/instances/1/fragments/chart/gpu?range=15m").text + client.get("/").text
    blocks = [b for b in _scripts(page) if b.strip()]
    json_blocks = [b for b in blocks if "GPU" in b]
    assert json_blocks, "the GPU chart's figure is embedded in a script block"
    for body in blocks:
        assert "<!--" not in body and "<script" not in body.lower() and "</" not in body
    assert any("!--" in b for b in json_blocks)  # the label is there, escaped


def test_a_label_with_a_link_is_plain_text_in_every_plotly_name_legend_hover_and_annotation(
    client: Any, token: str, clock: Any, batch_factory: Any
) -> None:
    _push_labelled(client, token, clock, batch_factory, LINK)
    fig = client.get("/api/v1/instances/1/charts/gpu?range=15m").json()["figure"]
    names = [tr.get("name", "") for tr in fig["data"]]
    assert any("&lt;a href" in n for n in names)  # the label reached a trace name, as text

    def strings(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    assert not [s for s in strings(fig) if "<a" in s.lower()]


# ------------------------------------------------------------------ 8: executor app (SSRF)
def _remote_instance(client: Any, token: str, clock: Any, batch_factory: Any, url: str) -> int:
    t = clock()
    for seq in range(1, 4):
        b = batch_factory(seq, t - 20 + seq * 5, instance=url)
        r = client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
    for name, spec in (("a", {}), ("b", {"kv_cache_dtype": "fp8"})):
        assert client.post("/api/v1/profiles", json={"name": name, "spec": spec}).status_code == 201
    listed = client.get("/api/v1/instances").json()["instances"]
    return int(next(i["id"] for i in listed if i["url"] == url))


@pytest.mark.parametrize("url", ["http://169.254.169.254:80", "http://10.0.0.5:8000", "http://127.0.0.1:8000"])
def test_executor_app_is_refused_for_an_instance_url_not_on_this_machines_own_loopback(
    client: Any, token: str, clock: Any, batch_factory: Any, url: str
) -> None:
    # the agent's host (rig1) is not this machine: the app would send POSTs wherever it pointed
    iid = _remote_instance(client, token, clock, batch_factory, url)
    body = {"instance": iid, "a": "a", "b": "b", "executor": "app"}
    r = client.post("/api/v1/experiments", json=body)
    assert r.status_code == 422, r.text
    assert "executor app is refused" in r.json()["error"] and "executor agent" in r.json()["error"]
    auto = client.post("/api/v1/experiments", json={**body, "executor": "auto"})
    assert auto.status_code == 201, auto.text
    assert client.get(f"/api/v1/experiments/{auto.json()['id']}").json()["options"]["executor"] == "agent"


def test_executor_app_still_runs_for_a_loopback_instance_of_this_machines_own_agent() -> None:
    import socket

    from app.ab.service import app_executor_refusal, default_executor

    here = socket.gethostname()
    assert app_executor_refusal("http://127.0.0.1:8000", here) is None
    assert default_executor("http://127.0.0.1:8000", here) == "app"
    assert app_executor_refusal("http://10.0.0.5:8000", here) is not None  # not loopback


def test_a_carriage_return_never_reaches_a_systemd_unit_or_the_launcher_env(tmp_path: Path) -> None:
    from agent.launcher.base import LauncherError
    from agent.launcher.systemd import SystemdLauncher
    from kvscope.errors import UserError

    unit = SystemdLauncher("vllm", base_argv=["vllm", "serve", "m"], dropin_dir=tmp_path, runner=lambda a: (0, ""))
    with pytest.raises(LauncherError, match="control character"):
        unit.render(["--max-num-seqs", "4\rExecStartPre=/bin/sh -c evil"])
    cfg = tmp_path / "launch.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path}"\n[[instance]]\nurl = "http://127.0.0.1:8001"\n'
        'command = ["vllm", "serve", "m"]\nenv = { HF_HOME = "/x\\rEvil=1" }\n'
    )
    with pytest.raises(UserError, match="control character"):
        load_config(cfg)
