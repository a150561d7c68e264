"""Test hosts as Linux network namespaces: a bridge in the root namespace (the "lab switch",
where the app listens) and one namespace per host joined to it by a veth pair. Addresses come
from a private /24 the test picks that no interface of the machine uses; nothing is routed off
the machine. Everything created is removed on close, by name."""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def why_not_available() -> str | None:
    """None when network namespaces can be made here, else the reason."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"kvsprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return f"`ip netns add` is not permitted here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False).stdout
    nets = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return nets


def pick_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    rnd = random.Random(os.getpid())
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rnd.randint(100, 250)}.{rnd.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free private /24 for the test network")


@dataclass
class TestLab:
    n_hosts: int
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000:04d}")
    subnet: ipaddress.IPv4Network = field(default_factory=pick_subnet)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"kvsbr{self.tag}"

    @property
    def app_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    def host_ip(self, i: int) -> str:
        return str(self.subnet.network_address + 10 + i)

    def ns(self, i: int) -> str:
        return f"kvs{self.tag}h{i}"

    def veth(self, i: int) -> tuple[str, str]:
        return f"kvs{self.tag}v{i}a", f"kvs{self.tag}v{i}b"

    def up(self) -> None:
        prefix = self.subnet.prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        _ip("addr", "add", f"{self.app_ip}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n_hosts):
            ns = self.ns(i)
            outside, inside = self.veth(i)
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=30)
            self.namespaces.append(ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self.links.append(outside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("addr", "add", f"{self.host_ip(i)}/{prefix}", "dev", inside, ns=ns)
            _ip("link", "set", inside, "up", ns=ns)

    def set_link(self, i: int, up: bool) -> None:
        """Cut (or restore) host i's network from inside its namespace: its pushes fail at once."""
        _ip("link", "set", self.veth(i)[1], "up" if up else "down", ns=self.ns(i))

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def down(self) -> None:
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=30)
        for link in reversed(self.links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False, timeout=30)
        self.namespaces.clear()
        self.links.clear()
