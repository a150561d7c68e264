"""`kvscope agent capture DIR`: raw answers of vLLM and nvidia-smi, identifiers masked.

So users can send us real captures. Masked: UUIDs (GPU, instance, request ids), this machine's
host names, user names in home paths, serial numbers, non-loopback IPv4 addresses and MAC
addresses. Each distinct value gets a stable placeholder, so a capture stays self-consistent.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx

from agent.gpu_smi import query_fields, run_once
from agent.vllm_reader import VllmReader

_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_HOME = re.compile(r"/home/([^/\s\"',]+)")
_SERIAL = re.compile(r"(<(?:serial|board_id|board_part_number|gpu_part_number)>)([^<]*)(</)")
_IPV4 = re.compile(r"\b(?!127\.)(?:\d{1,3}\.){3}\d{1,3}\b")
_HEXID = re.compile(r"\b((?:modelperm|cmpl|chatcmpl|req|chat)-)([0-9a-fA-F]{8,})\b")
_MAC = re.compile(r"\b(?:[0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}\b")


class Masker:
    def __init__(self, hostnames: list[str] | None = None) -> None:
        names = hostnames if hostnames is not None else _own_hostnames()
        self.hostnames = sorted({h for h in names if h and h not in ("localhost",)}, key=len, reverse=True)
        self.seen: dict[str, str] = {}

    def _sub(self, kind: str, value: str) -> str:
        key = f"{kind}:{value}"
        if key not in self.seen:
            n = sum(1 for k in self.seen if k.startswith(kind + ":")) + 1
            self.seen[key] = {
                "uuid": f"00000000-0000-0000-0000-{n:012d}",
                "host": f"host-{n}",
                "user": f"user{n}",
                "ip": f"192.0.2.{n % 250 + 1}",
                "mac": f"02:00:00:00:00:{n % 256:02x}",
                "serial": f"SERIAL-{n}",
                "hexid": f"{n:016x}",
            }[kind]
        return self.seen[key]

    def mask(self, text: str) -> str:
        text = _UUID.sub(lambda m: self._sub("uuid", m.group(0).lower()), text)
        text = _SERIAL.sub(
            lambda m: (
                m.group(1) + (m.group(2) if m.group(2) in ("N/A", "") else self._sub("serial", m.group(2))) + m.group(3)
            ),
            text,
        )
        text = _HEXID.sub(lambda m: m.group(1) + self._sub("hexid", m.group(2)), text)
        text = _HOME.sub(lambda m: "/home/" + self._sub("user", m.group(1)), text)
        text = _MAC.sub(lambda m: self._sub("mac", m.group(0).lower()), text)
        text = _IPV4.sub(lambda m: self._sub("ip", m.group(0)), text)
        for h in self.hostnames:
            text = re.sub(rf"(?<![\w.-]){re.escape(h)}(?![\w-])", self._sub("host", h), text)
        return text


def _own_hostnames() -> list[str]:
    names = [socket.gethostname()]
    try:
        names.append(socket.getfqdn())
    except OSError:
        pass
    return names


def capture(
    out_dir: Path,
    urls: list[str],
    *,
    mask: bool = True,
    timeout_s: float = 5.0,
    nvidia_smi: str | None = "nvidia-smi",
    client: httpx.Client | None = None,
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    masker = Masker()
    written: list[Path] = []

    def write(name: str, content: bytes | str) -> None:
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
        if mask:
            text = masker.mask(text)
        p = out_dir / name
        p.write_text(text)
        written.append(p)

    own = client is None
    http = client or httpx.Client(trust_env=False)
    try:
        for i, url in enumerate(urls):
            reader = VllmReader(url, http, timeout_s=timeout_s)
            for name, content in reader.fetch_raw().items():
                write(f"vllm{i}__{name}", content)
    finally:
        if own:
            http.close()
    if nvidia_smi:
        fields = ",".join(query_fields("pcie.link.gen.current"))
        for name, args in (
            ("nvidia_smi_query.csv", [nvidia_smi, f"--query-gpu={fields}", "--format=csv"]),
            ("nvidia_smi_q_x.xml", [nvidia_smi, "-q", "-x"]),
            ("nvidia_smi_dmon.txt", [nvidia_smi, "dmon", "-s", "t", "-c", "3"]),
            ("nvidia_smi_apps.csv", [nvidia_smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv"]),
        ):
            rc, out, err = run_once(args, 30.0)
            write(name, out if rc == 0 else f"exit code {rc}\n{out}{err}")
    meta = {"captured_at": time.time(), "urls": len(urls), "masked": mask, "tool": "kvscope agent capture"}
    write("capture.json", json.dumps(meta, indent=1))
    return written
