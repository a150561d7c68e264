"""kvscope-fake-nvidia-smi: the agent's queries, answered from sims' state files (formats as in
tests/fixtures/nvidia-smi), plus the agent's own nvidia-smi parser reading it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from agent.gpu_smi import parse_dmon, parse_query_csv, query_fields
from simulator import fake_nvidia_smi as smi
from simulator.profiles import MIB

FIELDS = (
    "index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw,"
    "pcie.link.gen.current,pcie.link.width.current"
)


def state(pid: int, gpu: int = 0, **kw: float) -> dict[str, object]:
    return {
        "pid": pid,
        "gpu_index": gpu,
        "gpu_name": "NVIDIA GeForce RTX 4070",
        "gpu_uuid": "GPU-5c8b1e3a-7d42-9f10-c2e6-84a0b3d9f217",
        "memory_total_bytes": 12282 * MIB,
        "memory_reserved_bytes": 11000 * MIB,
        "pcie_rx_bytes": 0,
        "pcie_tx_bytes": 0,
        "busy_seconds": 0,
        "power_limit_w": 200.0,
        "idle_power_w": 14.0,
        "pcie_gen_max": 4,
        "pcie_width_max": 16,
        "process_name": "/usr/bin/python3",
        **kw,
    }


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVSCOPE_SIM_STATE_DIR", str(tmp_path))
    return tmp_path


def put(d: Path, data: dict[str, object]) -> None:
    (d / f"sim-{data['pid']}.json").write_text(json.dumps(data))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = smi.main(list(args))
    return rc, capsys.readouterr().out


def test_query_with_units_matches_the_real_format(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(state_dir, state(os.getpid(), recent_utilization=0.97, recent_rx_bytes_per_s=2e9))
    rc, out = run(capsys, f"--query-gpu={FIELDS}", "--format=csv")
    header, row = out.strip().splitlines()
    real = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "nvidia_smi_query_4070_units.csv"
    assert rc == 0 and header == real.read_text().splitlines()[0]
    assert row == (
        "0, GPU-5c8b1e3a-7d42-9f10-c2e6-84a0b3d9f217, NVIDIA GeForce RTX 4070, 11004 MiB, 12282 MiB, "
        "97 %, 63, 194.42 W, 4, 16"
    )


def test_agent_parser_reads_the_fake(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(state_dir, state(os.getpid()))
    put(state_dir, state(os.getpid() + 0, gpu=1) | {"pid": 1})  # pid 1 is alive (init)
    for gen in ("pcie.link.gen.gpucurrent", "pcie.link.gen.current"):
        rc, out = run(capsys, "--query-gpu=" + ",".join(query_fields(gen)), "--format=csv,noheader,nounits")
        rows = parse_query_csv(out, query_fields(gen))
        assert rc == 0 and [r["index"] for r in rows] == ["0", "1"]
        assert rows[0]["memory.used"] == str(11004) and rows[0][gen] == "4"


def test_idle_gpu_without_sims(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(state_dir, state(999_999_999))  # a dead process's file is ignored
    rc, out = run(
        capsys,
        "--query-gpu=index,memory.used,utilization.gpu,pcie.link.gen.current,pcie.link.gen.max",
        "--format=csv,noheader,nounits",
    )
    assert rc == 0 and out == "0, 4, 0, 1, 4\n"  # consumer cards idle at PCIe Gen1


def test_unknown_field_fails_the_whole_query(
    state_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, out = run(capsys, "--query-gpu=index,bogus.field", "--format=csv")
    assert rc == 2 and out.startswith('Field "bogus.field" is not a valid field to query.')
    monkeypatch.setenv("KVSCOPE_FAKE_NVSMI_DRIVER", "550.120")
    rc, out = run(capsys, "--query-gpu=index,pcie.link.gen.gpucurrent", "--format=csv")
    assert rc == 2 and "pcie.link.gen.gpucurrent" in out


def test_compute_apps_and_xml(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(
        state_dir,
        state(
            os.getpid(), recent_tx_bytes_per_s=11_846_000_000, recent_rx_bytes_per_s=301_000_000, recent_utilization=0.5
        ),
    )
    rc, out = run(capsys, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv")
    assert rc == 0 and out.splitlines() == [
        "gpu_uuid, pid, used_memory [MiB]",
        f"GPU-5c8b1e3a-7d42-9f10-c2e6-84a0b3d9f217, {os.getpid()}, 11000 MiB",
    ]
    rc, out = run(capsys, "-q", "-x")
    gpu = ET.fromstring(out).find("gpu")
    assert gpu is not None
    assert gpu.findtext("pci/tx_util") == "11846000 KB/s" and gpu.findtext("pci/rx_util") == "301000 KB/s"
    assert gpu.findtext("fb_memory_usage/used") == "11004 MiB"
    assert gpu.findtext("processes/process_info/pid") == str(os.getpid())


def test_dmon_rates_come_from_cumulative_bytes() -> None:
    cum = smi._Cumulative()
    s = state(1, pcie_rx_bytes=0, pcie_tx_bytes=0, busy_seconds=0)
    assert cum.rates([s], 10.0) == {}
    s2 = state(1, pcie_rx_bytes=2e9, pcie_tx_bytes=5e8, busy_seconds=1.0)
    assert cum.rates([s2], 12.0) == {0: (1e9, 2.5e8, 0.5)}


def test_dmon_process_prints_lines_the_agent_parses(state_dir: Path) -> None:
    put(state_dir, state(os.getpid()))
    p = subprocess.run(
        [sys.executable, "-m", "simulator.fake_nvidia_smi", "dmon", "-s", "t", "-d", "0.1", "-c", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines[0].split() == ["#", "gpu", "rxpci", "txpci"] and len(lines) == 4
    assert parse_dmon(lines) == {"0": (0.0, 0.0)}


def test_no_gpu_mode(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVSCOPE_FAKE_NVSMI_NO_GPU", "1")
    rc, out = run(capsys, "--query-gpu=index", "--format=csv")
    assert rc == 6 and out.strip() == "No devices were found"
