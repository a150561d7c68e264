"""`kvscope agent ...` from the command line: light imports, once --print, parse, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise
from kvscope.cli import main
from tests.agent.fakevllm import PROM, FakeVllm, ServedFake

HEAVY = ("fastapi", "sqlalchemy", "jinja2", "plotly", "pydantic", "pydantic_settings", "starlette", "uvicorn")


def test_once_print_imports_nothing_heavy(tmp_path: Path) -> None:
    code = (
        "import sys, json\n"
        "from kvscope.cli import main\n"
        f"rc = main(['agent', 'once', '--print', '--vllm-url', sys.argv[1], '--state-dir', {str(tmp_path)!r}])\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}), file=sys.stderr)\n"
    )
    with ServedFake(FakeVllm(simulated=True)) as srv:
        p = subprocess.run([sys.executable, "-c", code, srv.url], capture_output=True, text=True, timeout=120)
    result = json.loads(p.stderr.strip().splitlines()[-1])
    assert result == {"rc": 0, "heavy": []}, p.stderr
    batch = json.loads(p.stdout)
    [scrape] = batch["scrapes"]
    assert scrape["ok"] and scrape["simulated"] and scrape["instance"] == srv.url
    assert any(s["name"] == "vllm:prefix_cache_hits_total" for s in scrape["samples"])
    assert any(s["name"] == "kvscope:host_memory_total_bytes" for s in batch["host_samples"])
    assert any(s["name"] == "kvscope:gpu_count" for s in batch["host_samples"])
    assert batch["events"][0]["kind"] == "agent_start"


def test_parse_prints_normalised_families(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "parse", str(PROM)]) == 0
    out = json.loads(capsys.readouterr().out)
    norm = normalise(parse(PROM.read_text(), KEEP_PREFIXES))
    got = [(s["name"], s["labels"], s["value"]) for f in out["families"].values() for s in f["samples"]]
    assert sorted(map(repr, got)) == sorted(map(repr, norm.samples))
    assert out["families"]["vllm:kv_offload_load_bytes"]["type"] == "counter"
    assert out["families"]["vllm:time_to_first_token_seconds"]["type"] == "histogram"
    assert out["shadowed_older_names"] == 4 and out["bad_lines"] == 0


def test_parse_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["agent", "parse", str(tmp_path / "nope.prom")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["agent", "--token", "t"], "--server URL is required"),
        (["agent", "--server", "http://a"], "an agent token is required: --token-file PATH"),
        (["agent", "--server", "ftp://a", "--token", "t"], "must start with http"),
        (["agent", "--server", "http://a", "--token", "t", "--vllm-url", "localhost:8000"], "must start with http"),
    ],
)
def test_agent_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVSCOPE_SERVER", raising=False)
    monkeypatch.delenv("KVSCOPE_AGENT_TOKEN", raising=False)
    assert main([*argv, "--state-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_launcher_config_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(
        [
            "agent",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--state-dir",
            str(tmp_path),
            "--launcher-config",
            str(tmp_path / "missing.toml"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "missing.toml" in err or "controller" in err


def test_capture_masks_identifiers(tmp_path: Path) -> None:
    from agent.capture import Masker

    with ServedFake(FakeVllm()) as srv:
        assert main(["agent", "capture", str(tmp_path / "cap"), "--vllm-url", srv.url, "--no-gpu"]) == 0
    files = sorted(p.name for p in (tmp_path / "cap").iterdir())
    assert files == [
        "capture.json",
        "vllm0__health.txt",
        "vllm0__metrics.prom",
        "vllm0__v1_models.json",
        "vllm0__version.json",
    ]
    models = (tmp_path / "cap" / "vllm0__v1_models.json").read_text()
    assert "modelperm-bc3d0d9a6491de96" not in models and "modelperm-0000000000000001" in models
    m = Masker(hostnames=["gpu-box-7.lab.example"])
    masked = m.mask(
        "GPU-5c8b1e3a-7d42-9f10-c2e6-84a0b3d9f217 on gpu-box-7.lab.example /home/alice/models "
        "10.1.2.3 127.0.0.1 <serial>1324021012345</serial> GPU-5C8B1E3A-7D42-9F10-C2E6-84A0B3D9F217"
    )
    assert masked == (
        "GPU-00000000-0000-0000-0000-000000000001 on host-1 /home/user1/models 192.0.2.2 127.0.0.1 "
        "<serial>SERIAL-1</serial> GPU-00000000-0000-0000-0000-000000000001"
    )
