"""A demo restarted on its data folder gives each simulated server the port it had, so the
dashboard keeps the same instances (an instance is its host and URL) instead of adding new ones."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from kvscope.demo import SERVERS, demo_ports


def test_a_restarted_demo_keeps_its_servers_ports_while_they_are_free(tmp_path: Path) -> None:
    first = demo_ports(tmp_path)
    assert set(first) == {s.key for s in SERVERS} and len(set(first.values())) == len(first)
    assert demo_ports(tmp_path) == first
    assert json.loads((tmp_path / "demo-ports.json").read_text()) == first


def test_a_port_taken_meanwhile_is_replaced_and_the_others_kept(tmp_path: Path) -> None:
    first = demo_ports(tmp_path)
    key, port = next(iter(first.items()))
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", port))
        busy.listen()
        again = demo_ports(tmp_path)
    assert again[key] != port
    assert {k: v for k, v in again.items() if k != key} == {k: v for k, v in first.items() if k != key}
    assert len(set(again.values())) == len(again)


def test_a_garbled_or_hostile_ports_file_means_fresh_ports(tmp_path: Path) -> None:
    for text in (
        "not json",
        "[1, 2]",
        json.dumps({s.key: 80 for s in SERVERS}),
        json.dumps({s.key: True for s in SERVERS}),
    ):
        (tmp_path / "demo-ports.json").write_text(text)
        got = demo_ports(tmp_path)
        assert all(1024 < p < 65536 for p in got.values()) and len(set(got.values())) == len(got)
    same = {s.key: 40000 for s in SERVERS}  # two servers may not share a port
    (tmp_path / "demo-ports.json").write_text(json.dumps(same))
    assert len(set(demo_ports(tmp_path).values())) == len(SERVERS)
