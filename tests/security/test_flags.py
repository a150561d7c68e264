"""Issue 14, flags: extra_args is an allow-list, checked by the app (422 naming the flag) and again
by the agent's preflight (a command forged past the app is refused before anything restarts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.controller import load_config
from agent.preflight_policy import check_flag_policy
from app.controller.profiles import parse_profile
from kvcore import flag_policy
from tests.app.controller.test_controller import FakeLauncher, _cmd, _ctl

# Each bypass of the old deny-list found in issue 14: (extra_args, the flag the refusal must name).
BYPASSES = [
    (["--worker-extension-cls", "evil.Ext"], "--worker-extension-cls"),
    (["--tool-parser-plugin", "/tmp/evil.py"], "--tool-parser-plugin"),
    (["--middleware", "evil.mw"], "--middleware"),
    (["--tokenizer", "/tmp/evil", "--trust-remote-code"], "--tokenizer"),
    (["--trust-remote-code"], "--trust-remote-code"),
    (["--model", "/tmp/other-model"], "--model"),
    (["--config", "/tmp/more-flags.yaml"], "--config"),
    (["-O3"], "-O"),
    (["-O", "3"], "-O"),
    (["--kv_transfer_config", '{"kv_connector":"X","kv_role":"kv_both"}'], "--kv-transfer-config"),
    (["--kv-transfer-conf", '{"kv_connector":"X","kv_role":"kv_both"}'], "--kv-transfer-conf"),
    (["--host", "0.0.0.0"], "--host"),
    (["--port", "9999"], "--port"),
    (["-tp", "2"], "-tp"),
    (["--kv-transfer-config.kv_connector_module_path", "evil"], "--kv-transfer-config"),
    (["--compilation-config", '{"inductor_passes":{"x":"evil.pass"}}'], "--compilation-config"),
    (["--enforce-eager", "evil-positional"], "evil-positional"),
    (["--max-num-seqs", "--trust-remote-code"], "--max-num-seqs"),
]
IDS = [" ".join(b[0])[:40] for b in BYPASSES]


@pytest.mark.parametrize(("extra", "flag"), BYPASSES, ids=IDS)
def test_each_bypass_is_refused_by_the_app_api_naming_the_flag(client: Any, extra: list[str], flag: str) -> None:
    r = client.post("/api/v1/profiles", json={"name": "evil", "spec": {"extra_args": extra}})
    assert r.status_code == 422, r.text
    assert flag in r.text
    assert client.get("/api/v1/profiles/evil").status_code == 404


@pytest.mark.parametrize(("extra", "flag"), BYPASSES, ids=IDS)
def test_each_bypass_forged_past_the_app_is_refused_by_the_agent_preflight(extra: list[str], flag: str) -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl)
    assert ctl.run_rollout(_cmd(1, ["--max-model-len", "4096", *extra])) == "refused"
    assert fl.calls == []  # nothing restarted
    last = ctl.drain_updates()[-1]
    assert flag in last.message
    policy = next(c for c in last.data["preflight"] if c["name"] == "flag_policy")
    assert policy["status"] == "refuse"


def test_a_forged_last_known_good_argv_is_refused_too() -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl)
    cmd = _cmd(1, ["--max-model-len", "4096"], lkg_argv=["--trust-remote-code"])
    assert ctl.run_rollout(cmd) == "refused"
    assert fl.calls == []
    assert "last-known-good" in ctl.drain_updates()[-1].message


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_module_path": "evil"}, "module_path"),
        ({"kv_connector": "EvilConnector", "kv_role": "kv_both"}, "EvilConnector"),
        (
            {
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"spec_name": "X", "spec_module_path": "evil"},
            },
            "spec_module_path",
        ),
        (
            {
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"spec_name": "EvilSpec"},
            },
            "EvilSpec",
        ),
        (
            {
                "kv_connector": "ExampleConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": "relative/dir"},
            },
            "absolute",
        ),
    ],
)
def test_a_forged_transfer_config_is_refused_by_the_agent_key_by_key(config: dict[str, Any], fragment: str) -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl)
    assert ctl.run_rollout(_cmd(1, ["--kv-transfer-config", json.dumps(config)])) == "refused"
    assert fl.calls == []
    assert fragment in ctl.drain_updates()[-1].message


def test_the_flags_a_profile_renders_pass_the_agent_policy() -> None:
    specs: list[dict[str, Any]] = [
        {"offload_size_gib": 8},
        {
            "offload_size_gib": 2,
            "offload_spec": "tiering",
            "fs_tier": {"root_dir": "/mnt/kv"},
            "eviction_policy": "arc",
        },
        {"disk_tier": {"shared_storage_path": "/srv/kv"}, "kv_events": {"endpoint": "tcp://127.0.0.1:5557"}},
        {"lmcache": {"max_local_cpu_size_gib": 4, "local_disk": "/srv/lmc", "chunk_size": 256}},
        {"mooncake_store": {}},
        {"kv_cache_dtype": "fp8", "max_model_len": 4096, "enable_prefix_caching": False},
        {"extra_args": ["--enforce-eager", "--num-gpu-blocks-override=24", "--max_num_seqs", "8"]},
    ]
    allowed = flag_policy.allowed_flags()
    for spec in specs:
        argv = parse_profile("p", spec).to_argv()
        assert flag_policy.refusal(argv, allowed=allowed, fields=True) is None, argv
        assert check_flag_policy(argv, [], ()).status == "pass"


def test_safe_extra_args_still_pass_at_the_app(client: Any) -> None:
    r = client.post(
        "/api/v1/profiles",
        json={"name": "eager", "spec": {"extra_args": ["--enforce-eager", "--max-num-seqs", "8"]}},
    )
    assert r.status_code == 201, r.text
    assert r.json()["argv"] == ["--enforce-eager", "--max-num-seqs", "8"]


def test_values_of_allowed_flags_are_checked() -> None:
    allowed = flag_policy.allowed_flags()
    assert "not a whole number" in (flag_policy.refusal(["--max-num-seqs", "many"], allowed=allowed) or "")
    assert "not one of" in (flag_policy.refusal(["--scheduling-policy", "evil"], allowed=allowed) or "")
    assert "takes no value" in (flag_policy.refusal(["--enforce-eager=yes"], allowed=allowed) or "")
    assert "needs a value" in (flag_policy.refusal(["--max-num-seqs"], allowed=allowed) or "")
    assert flag_policy.refusal(["--max-num-batched-tokens", "8k"], allowed=allowed) is None


def test_the_agents_launcher_config_widens_the_list_for_its_own_servers(tmp_path: Path) -> None:
    cfg = tmp_path / "launch.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path}"\nallow_flags = ["--seed"]\n[[instance]]\nurl = "http://127.0.0.1:8001"\n'
        'command = ["vllm", "serve", "m"]\nallow_flags = ["--swap_space"]\n'
    )
    instances, _data = load_config(cfg)
    widen = instances[0].allow_flags
    assert check_flag_policy(["--seed", "1", "--swap-space", "4"], [], widen).status == "pass"
    assert check_flag_policy(["--seed", "1"], [], ()).status == "refuse"
    assert check_flag_policy(["--trust-remote-code"], [], widen).status == "refuse"
    # the app's own list is not widened by an agent: a widened flag is still refused there
    assert "not on the allow-list" in (flag_policy.refusal(["--seed", "1"], allowed=flag_policy.allowed_flags()) or "")


def test_a_stored_profile_that_no_longer_validates_shows_as_invalid(client: Any, app: Any) -> None:
    from app.storage import rollouts_store as rs

    rs.create_profile(app.state.ctx.engine, "old", {"extra_args": ["--trust-remote-code"]}, 1.0)
    listed = client.get("/api/v1/profiles").json()["profiles"]
    old = next(p for p in listed if p["name"] == "old")
    assert old["argv"] == [] and "--trust-remote-code" in old["error"]
    page = client.get("/profiles")
    assert page.status_code == 200 and "--trust-remote-code is refused" in page.text
    one = client.get("/profiles/old")
    assert one.status_code == 200 and "--trust-remote-code is refused" in one.text


def test_the_apps_allow_flags_setting_widens_its_own_list(client: Any, app: Any) -> None:
    body = {"name": "seeded", "spec": {"extra_args": ["--seed", "1"]}}
    assert client.post("/api/v1/profiles", json=body).status_code == 422
    app.state.ctx.settings.controller.allow_flags = ["--seed"]
    r = client.post("/api/v1/profiles", json=body)
    assert r.status_code == 201, r.text
    assert client.get("/api/v1/profiles/seeded").json()["error"] is None
