"""Which GPUs an instance uses: the process listening on its port and the processes of its
session, matched against the GPU readers' per-process memory, on a /proc tree written here."""

from __future__ import annotations

import os
from pathlib import Path

from agent.instance_gpus import INSTANCE_GPU, PROCESS_MEMORY, InstanceGpus, url_port
from kvcore.protocol import Sample, Scrape


def _proc(root: Path, pid: int, session: int, sockets: tuple[int, ...] = ()) -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime ...
    fields = ["S", "1", str(session), str(session)] + ["0"] * 15 + ["4242"] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (python3) " + " ".join(fields) + "\n")
    for i, inode in enumerate(sockets):
        os.symlink(f"socket:[{inode}]", d / "fd" / str(3 + i))


def _tcp(root: Path, listeners: dict[int, int]) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = [
        f"   {i}: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode}"
        for i, (port, inode) in enumerate(listeners.items())
    ]
    (root / "net" / "tcp").write_text(head + "\n".join(rows) + "\n")


def _gpu(gpu: str, pid: int) -> Sample:
    return Sample(PROCESS_MEMORY, {"gpu": gpu, "pid": str(pid)}, 6e9)


def test_each_instance_gets_the_gpus_its_own_processes_use(tmp_path: Path) -> None:
    _tcp(tmp_path, {8000: 111, 8001: 222})
    _proc(tmp_path, 100, 100, sockets=(111,))  # API server of :8000
    _proc(tmp_path, 101, 100)  # its engine core (same session) on GPU 0 and GPU 2
    _proc(tmp_path, 200, 200, sockets=(222,))  # the other instance, alone on GPU 1
    host = [_gpu("0", 101), _gpu("2", 101), _gpu("1", 200), _gpu("3", 999)]  # 999: a process of nobody's
    a = Scrape("http://127.0.0.1:8000", 1.0, True)
    b = Scrape("http://127.0.0.1:8001", 1.0, True)
    down = Scrape("http://127.0.0.1:8002", 1.0, False)
    InstanceGpus(tmp_path).annotate([a, b, down], host, now=1.0)
    assert [s.labels["gpu"] for s in a.samples if s.name == INSTANCE_GPU] == ["0", "2"]
    assert [s.labels["gpu"] for s in b.samples if s.name == INSTANCE_GPU] == ["1"]
    assert down.samples == [] and a.types[INSTANCE_GPU] == "gauge"


def test_nothing_is_claimed_without_process_readings_or_a_listener(tmp_path: Path) -> None:
    _tcp(tmp_path, {})
    _proc(tmp_path, 100, 100)
    s = Scrape("http://127.0.0.1:8000", 1.0, True)
    InstanceGpus(tmp_path).annotate([s], [_gpu("0", 100)], now=1.0)
    InstanceGpus(tmp_path).annotate([s], [], now=1.0)
    assert s.samples == []
    assert url_port("http://h:9000/v1") == 9000 and url_port("https://h") == 443 and url_port("http://h:x") is None
