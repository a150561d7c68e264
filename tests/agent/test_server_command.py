"""Reading the command typed after `kvscope up --`: the typed profile flags become the starting
profile (and a rollout's argv never repeats one), the rest stays the base command; the URL from
--host/--port with vLLM's defaults; the program looked up on PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.server_command import resolve_program, server_url, split_profile_flags
from app.controller.profiles import parse_profile
from kvscope.cli import split_trailing_command

EVENTS = '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","topic":"kv"}'


def test_profile_flags_split_from_the_base_command_in_every_form() -> None:
    typed = [
        "vllm", "serve", "Qwen/Qwen3-4B", "--port", "8001", "--max_model_len=16384", "--tensor-parallel-size", "2",
        "--kv-offloading-size", "8", "--enforce-eager", "--served-model-name", "a", "b",
        "--kv-events-config", EVENTS, "--trust-remote-code", "--gpu-memory-utilization", "0.85",
    ]  # fmt: skip
    base, flags = split_profile_flags(typed)
    assert base == [
        "vllm", "serve", "Qwen/Qwen3-4B", "--port", "8001", "--tensor-parallel-size", "2",
        "--served-model-name", "a", "b", "--trust-remote-code",
    ]  # fmt: skip
    assert flags == [
        "--max_model_len=16384", "--kv-offloading-size", "8", "--enforce-eager",
        "--kv-events-config", EVENTS, "--gpu-memory-utilization", "0.85",
    ]  # fmt: skip


def test_a_profile_replaces_the_typed_flags_instead_of_repeating_them() -> None:
    base, typed = split_profile_flags(["vllm", "serve", "m", "--max-model-len", "4096", "--kv-cache-dtype", "auto"])
    assert typed == ["--max-model-len", "4096", "--kv-cache-dtype", "auto"]
    after = [*base, *parse_profile("p", {"max_model_len": 8192, "kv_cache_dtype": "fp8"}).to_argv()]
    assert after.count("--max-model-len") == 1 and after.count("--kv-cache-dtype") == 1
    assert after == ["vllm", "serve", "m", "--kv-cache-dtype", "fp8", "--max-model-len", "8192"]


def test_a_profile_flag_without_its_value_stays_in_the_base_for_the_server_to_refuse() -> None:
    assert split_profile_flags(["vllm", "serve", "m", "--max-model-len"]) == (
        ["vllm", "serve", "m", "--max-model-len"],
        [],
    )


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        (["vllm", "serve", "m"], "http://127.0.0.1:8000"),
        (["vllm", "serve", "m", "--port", "8001", "--host", "0.0.0.0"], "http://127.0.0.1:8001"),
        (["vllm", "serve", "m", "--host=10.0.0.5", "--port=9000"], "http://10.0.0.5:9000"),
        (["vllm", "serve", "m", "--host", "::1"], "http://[::1]:8000"),
        (["vllm", "serve", "m", "--port", "1", "--port", "8002"], "http://127.0.0.1:8002"),  # the last one wins
    ],
)
def test_the_server_url_comes_from_host_and_port_with_vllms_defaults(argv: list[str], url: str) -> None:
    assert server_url(argv) == url


@pytest.mark.parametrize("port", ["x", "0", "70000"])
def test_a_port_that_is_no_port_is_refused(port: str) -> None:
    with pytest.raises(ValueError, match="--port"):
        server_url(["vllm", "serve", "m", "--port", port])


def test_the_program_is_looked_up_on_path_or_said_why_not(tmp_path: Path) -> None:
    exe = tmp_path / "myvllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (tmp_path / "plain").write_text("")
    env = {"PATH": str(tmp_path)}
    assert resolve_program("myvllm", env, "/") == (str(exe), "")
    assert resolve_program("nosuchvllm", env, "/") == (None, "not found on PATH")
    assert resolve_program("./plain", env, str(tmp_path)) == (None, "not an executable file")
    assert resolve_program(str(tmp_path / "gone"), env, "/") == (None, "no such file")
    assert resolve_program("./myvllm", env, str(tmp_path)) == (os.path.join(str(tmp_path), "./myvllm"), "")


def test_up_and_service_hand_on_what_follows_their_first_dash_dash() -> None:
    assert split_trailing_command(["up", "--port", "9", "--", "vllm", "serve", "--", "x"]) == (
        ["up", "--port", "9"],
        ["vllm", "serve", "--", "x"],
    )
    assert split_trailing_command(["up", "--"]) == (["up"], [])
    assert split_trailing_command(["up", "--port", "9"]) == (["up", "--port", "9"], None)
    assert split_trailing_command(["service", "install", "up", "--", "--port", "9", "--", "vllm"]) == (
        ["service", "install", "up"],
        ["--port", "9", "--", "vllm"],
    )
    assert split_trailing_command(["agent", "--", "x"]) == (["agent", "--", "x"], None)
