"""`kvscope-fake-nvidia-smi`: answers the agent's nvidia-smi queries from the running sims' state files.

Supported: `--query-gpu=FIELDS --format=csv[,noheader][,nounits]` (with `-i`, `-l`, `-lms`),
`--query-compute-apps=FIELDS`, `-q -x`, `-L`, and `dmon [-s puct] [-d S] [-c N] [-i I]` (a long-lived
process printing one line per GPU per interval). Unknown fields fail the whole query with the real
text and exit code 2. Readings are simulated: memory used is what the sims reserved; PCIe rx/tx
are the KV bytes the sims loaded/stored; utilization is the share of time a sim was busy.
Environment: KVSCOPE_SIM_STATE_DIR (where sims write), KVSCOPE_FAKE_NVSMI_NO_GPU=1 (no device),
KVSCOPE_FAKE_NVSMI_DRIVER (default 590.44.01; below 590 `pcie.link.gen.gpucurrent` is unknown).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.profiles import MIB, RTX4070
from simulator.state import read_states

EXIT_INVALID_ARG = 2
EXIT_NO_DEVICE = 6


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total: int
    memory_used: int
    util: float
    rx_bps: float
    tx_bps: float
    power_limit: float
    idle_power: float
    gen_max: int
    width_max: int
    processes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gen_current(self) -> int:
        return self.gen_max if self.util > 0.0 or self.processes else 1  # consumer cards idle at Gen1

    @property
    def temperature(self) -> int:
        return round(34 + 30 * self.util)

    @property
    def power(self) -> float:
        return self.idle_power + (self.power_limit - self.idle_power) * self.util

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.index + 1:02X}:00.0"


def driver_version() -> str:
    return os.environ.get("KVSCOPE_FAKE_NVSMI_DRIVER", "590.44.01")


def _driver_major() -> int:
    try:
        return int(driver_version().split(".")[0])
    except ValueError:
        return 590


def gpus_now(states: list[dict[str, Any]] | None = None) -> list[Gpu]:
    states = read_states() if states is None else states
    by_index: dict[int, list[dict[str, Any]]] = {}
    for s in states:
        by_index.setdefault(int(s.get("gpu_index", 0)), []).append(s)
    count = max([0, *(i + 1 for i in by_index)]) or 1
    out = []
    for i in range(count):
        sims = by_index.get(i, [])
        first = sims[0] if sims else {}
        total = int(first.get("memory_total_bytes", RTX4070.memory_total_bytes))
        used = min(total, 4 * MIB + sum(int(s.get("memory_reserved_bytes", 0)) for s in sims))
        uuid = str(first.get("gpu_uuid", RTX4070.uuid))
        if i and not sims:
            uuid = uuid[:-2] + f"{i:02d}"
        out.append(
            Gpu(
                index=i,
                name=str(first.get("gpu_name", RTX4070.name)),
                uuid=uuid,
                memory_total=total,
                memory_used=used,
                util=min(1.0, sum(float(s.get("recent_utilization", 0.0)) for s in sims)),
                rx_bps=sum(float(s.get("recent_rx_bytes_per_s", 0.0)) for s in sims),
                tx_bps=sum(float(s.get("recent_tx_bytes_per_s", 0.0)) for s in sims),
                power_limit=float(first.get("power_limit_w", RTX4070.power_limit_w)),
                idle_power=float(first.get("idle_power_w", RTX4070.idle_power_w)),
                gen_max=int(first.get("pcie_gen_max", 4)),
                width_max=int(first.get("pcie_width_max", 16)),
                processes=[
                    {
                        "pid": int(s["pid"]),
                        "used": int(s.get("memory_reserved_bytes", 0)),
                        "name": str(s.get("process_name", "python3")),
                    }
                    for s in sims
                ],
            )
        )
    return out


# field -> (header unit or "", value function(gpu, units) -> str)
def _mib(v: int, units: bool) -> str:
    return f"{v // MIB} MiB" if units else str(v // MIB)


def _pct(v: float, units: bool) -> str:
    return f"{round(v * 100)} %" if units else str(round(v * 100))


def _w(v: float, units: bool) -> str:
    return f"{v:.2f} W" if units else f"{v:.2f}"


GpuField = Callable[[Gpu, bool], str]
GPU_FIELDS: dict[str, tuple[str, GpuField]] = {
    "index": ("", lambda g, u: str(g.index)),
    "uuid": ("", lambda g, u: g.uuid),
    "name": ("", lambda g, u: g.name),
    "gpu_name": ("", lambda g, u: g.name),
    "pci.bus_id": ("", lambda g, u: g.bus_id),
    "driver_version": ("", lambda g, u: driver_version()),
    "pstate": ("", lambda g, u: "P2" if g.util > 0 else "P8"),
    "memory.total": ("MiB", lambda g, u: _mib(g.memory_total, u)),
    "memory.used": ("MiB", lambda g, u: _mib(g.memory_used, u)),
    "memory.free": ("MiB", lambda g, u: _mib(g.memory_total - g.memory_used, u)),
    "utilization.gpu": ("%", lambda g, u: _pct(g.util, u)),
    "utilization.memory": ("%", lambda g, u: _pct(g.util * 0.6, u)),
    "temperature.gpu": ("", lambda g, u: str(g.temperature)),
    "power.draw": ("W", lambda g, u: _w(g.power, u)),
    "power.draw.average": ("W", lambda g, u: _w(g.power, u)),
    "power.limit": ("W", lambda g, u: _w(g.power_limit, u)),
    "fan.speed": ("%", lambda g, u: _pct(0.3 + 0.4 * g.util, u)),
    "pcie.link.gen.current": ("", lambda g, u: str(g.gen_current)),
    "pcie.link.gen.gpucurrent": ("", lambda g, u: str(g.gen_current)),
    "pcie.link.gen.max": ("", lambda g, u: str(g.gen_max)),
    "pcie.link.gen.gpumax": ("", lambda g, u: str(g.gen_max)),
    "pcie.link.width.current": ("", lambda g, u: str(g.width_max)),
    "pcie.link.width.max": ("", lambda g, u: str(g.width_max)),
    "clocks.sm": ("MHz", lambda g, u: f"{2610 if g.util else 210} MHz" if u else str(2610 if g.util else 210)),
}

APP_FIELDS = ("pid", "process_name", "name", "used_memory", "used_gpu_memory", "gpu_uuid", "gpu_bus_id", "gpu_name")


def _valid_gpu_field(f: str) -> bool:
    if f == "pcie.link.gen.gpucurrent" and _driver_major() < 590:
        return False
    return f in GPU_FIELDS


def _select(gpus: list[Gpu], ids: str | None) -> list[Gpu]:
    if ids is None:
        return gpus
    want = {x.strip() for x in ids.split(",")}
    return [g for g in gpus if str(g.index) in want or g.uuid in want or g.bus_id in want]


def query_gpu(fields: list[str], fmt: set[str], ids: str | None) -> tuple[int, str]:
    for f in fields:
        if not _valid_gpu_field(f):
            return EXIT_INVALID_ARG, f'Field "{f}" is not a valid field to query.\n\n'
    units = "nounits" not in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(f"{f} [{GPU_FIELDS[f][0]}]" if GPU_FIELDS[f][0] and units else f for f in fields))
    for g in _select(gpus_now(), ids):
        lines.append(", ".join(GPU_FIELDS[f][1](g, units) for f in fields))
    return 0, "\n".join(lines) + "\n"


def query_apps(fields: list[str], fmt: set[str], ids: str | None) -> tuple[int, str]:
    for f in fields:
        if f not in APP_FIELDS:
            return EXIT_INVALID_ARG, f'Field "{f}" is not a valid field to query.\n\n'
    units = "nounits" not in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(
            ", ".join(f"{f} [MiB]" if f in ("used_memory", "used_gpu_memory") and units else f for f in fields)
        )
    for g in _select(gpus_now(), ids):
        for p in g.processes:
            vals = {
                "pid": str(p["pid"]),
                "process_name": p["name"],
                "name": p["name"],
                "used_memory": _mib(p["used"], units),
                "used_gpu_memory": _mib(p["used"], units),
                "gpu_uuid": g.uuid,
                "gpu_bus_id": g.bus_id,
                "gpu_name": g.name,
            }
            lines.append(", ".join(vals[f] for f in fields))
    return 0, "\n".join(lines) + ("\n" if lines else "")


def query_xml() -> str:
    gpus = gpus_now()
    parts = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
        "<nvidia_smi_log>",
        f"\t<timestamp>{time.strftime('%a %b %d %H:%M:%S %Y')}</timestamp>",
        f"\t<driver_version>{driver_version()}</driver_version>",
        "\t<cuda_version>13.1</cuda_version>",
        f"\t<attached_gpus>{len(gpus)}</attached_gpus>",
    ]
    for g in gpus:
        procs = "".join(
            f"\n\t\t\t<process_info>\n\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>\n\t\t\t\t<compute_instance_id>"
            f"N/A</compute_instance_id>\n\t\t\t\t<pid>{p['pid']}</pid>\n\t\t\t\t<type>C</type>\n\t\t\t\t"
            f"<process_name>{p['name']}</process_name>\n\t\t\t\t<used_memory>{p['used'] // MIB} MiB</used_memory>"
            "\n\t\t\t</process_info>"
            for p in g.processes
        )
        parts.append(f"""\t<gpu id="{g.bus_id}">
\t\t<product_name>{g.name}</product_name>
\t\t<product_brand>GeForce</product_brand>
\t\t<persistence_mode>Enabled</persistence_mode>
\t\t<mig_mode>
\t\t\t<current_mig>N/A</current_mig>
\t\t\t<pending_mig>N/A</pending_mig>
\t\t</mig_mode>
\t\t<uuid>{g.uuid}</uuid>
\t\t<minor_number>{g.index}</minor_number>
\t\t<pci>
\t\t\t<pci_bus_id>{g.bus_id}</pci_bus_id>
\t\t\t<pci_gpu_link_info>
\t\t\t\t<pcie_gen>
\t\t\t\t\t<max_link_gen>{g.gen_max}</max_link_gen>
\t\t\t\t\t<current_link_gen>{g.gen_current}</current_link_gen>
\t\t\t\t\t<device_current_link_gen>{g.gen_current}</device_current_link_gen>
\t\t\t\t\t<max_device_link_gen>{g.gen_max}</max_device_link_gen>
\t\t\t\t\t<max_host_link_gen>{g.gen_max}</max_host_link_gen>
\t\t\t\t</pcie_gen>
\t\t\t\t<link_widths>
\t\t\t\t\t<max_link_width>{g.width_max}x</max_link_width>
\t\t\t\t\t<current_link_width>{g.width_max}x</current_link_width>
\t\t\t\t</link_widths>
\t\t\t</pci_gpu_link_info>
\t\t\t<tx_util>{round(g.tx_bps / 1000)} KB/s</tx_util>
\t\t\t<rx_util>{round(g.rx_bps / 1000)} KB/s</rx_util>
\t\t</pci>
\t\t<fan_speed>{round(30 + 40 * g.util)} %</fan_speed>
\t\t<performance_state>{"P2" if g.util else "P8"}</performance_state>
\t\t<fb_memory_usage>
\t\t\t<total>{g.memory_total // MIB} MiB</total>
\t\t\t<reserved>0 MiB</reserved>
\t\t\t<used>{g.memory_used // MIB} MiB</used>
\t\t\t<free>{(g.memory_total - g.memory_used) // MIB} MiB</free>
\t\t</fb_memory_usage>
\t\t<utilization>
\t\t\t<gpu_util>{round(g.util * 100)} %</gpu_util>
\t\t\t<memory_util>{round(g.util * 60)} %</memory_util>
\t\t</utilization>
\t\t<temperature>
\t\t\t<gpu_temp>{g.temperature} C</gpu_temp>
\t\t</temperature>
\t\t<gpu_power_readings>
\t\t\t<average_power_draw>{g.power:.2f} W</average_power_draw>
\t\t\t<instant_power_draw>{g.power:.2f} W</instant_power_draw>
\t\t\t<current_power_limit>{g.power_limit:.2f} W</current_power_limit>
\t\t</gpu_power_readings>
\t\t<processes>{procs}
\t\t</processes>
\t</gpu>
""")
    parts.append("</nvidia_smi_log>")
    return "\n".join(parts) + "\n"


class _Cumulative:
    """PCIe rates over the dmon interval, from the sims' cumulative byte counters (per pid)."""

    def __init__(self) -> None:
        self.prev: dict[int, tuple[float, float, float, float]] = {}

    def rates(self, states: list[dict[str, Any]], now: float) -> dict[int, tuple[float, float, float]]:
        out: dict[int, tuple[float, float, float]] = {}
        seen: dict[int, tuple[float, float, float, float]] = {}
        for s in states:
            pid = int(s["pid"])
            cur = (
                now,
                float(s.get("pcie_rx_bytes", 0)),
                float(s.get("pcie_tx_bytes", 0)),
                float(s.get("busy_seconds", 0)),
            )
            seen[pid] = cur
            p = self.prev.get(pid)
            if p is None or now <= p[0]:
                continue
            dt = now - p[0]
            gi = int(s.get("gpu_index", 0))
            rx, tx, busy = out.get(gi, (0.0, 0.0, 0.0))
            out[gi] = (
                rx + max(0.0, cur[1] - p[1]) / dt,
                tx + max(0.0, cur[2] - p[2]) / dt,
                busy + max(0.0, cur[3] - p[3]) / dt,
            )
        self.prev = seen
        return out


def dmon(select: str, delay: float, count: int | None, ids: str | None) -> int:
    cols: list[tuple[str, str, str]] = []  # (letter group, name, unit)
    for letter in select:
        if letter == "p":
            cols += [("p", "pwr", "W"), ("p", "gtemp", "C")]
        elif letter == "u":
            cols += [("u", "sm", "%"), ("u", "mem", "%")]
        elif letter == "m":
            cols += [("m", "fb", "MB")]
        elif letter == "t":
            cols += [("t", "rxpci", "MB/s"), ("t", "txpci", "MB/s")]
        elif letter not in "cvme":
            print(f"Invalid metric group: {letter}")
            return EXIT_INVALID_ARG
    print("# gpu " + "".join(f"{n:>6} " for _, n, _ in cols))
    print("# Idx " + "".join(f"{u:>6} " for _, _, u in cols), flush=True)
    cum = _Cumulative()
    cum.rates(read_states(), time.monotonic())
    n = 0
    while count is None or n < count:
        time.sleep(delay)
        states = read_states()
        rates = cum.rates(states, time.monotonic())
        for g in _select(gpus_now(states), ids):
            rx, tx, busy = rates.get(g.index, (0.0, 0.0, 0.0))
            g.util = min(1.0, busy)
            vals = {
                "pwr": f"{round(g.power)}",
                "gtemp": str(g.temperature),
                "sm": str(round(g.util * 100)),
                "mem": str(round(g.util * 60)),
                "fb": str(g.memory_used // MIB),
                "rxpci": str(round(rx / 1e6)),
                "txpci": str(round(tx / 1e6)),
            }
            print(f"{g.index:>5} " + "".join(f"{vals[c]:>6} " for _, c, _ in cols), flush=True)
        n += 1
    return 0


def _opt(argv: list[str], i: int, name: str) -> tuple[str | None, int]:
    """Value of `--name=value` or `--name value` / `-x value` at argv[i]; returns (value, next index)."""
    a = argv[i]
    if a.startswith(name + "="):
        return a.split("=", 1)[1], i + 1
    if i + 1 < len(argv):
        return argv[i + 1], i + 2
    return None, i + 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
    if os.environ.get("KVSCOPE_FAKE_NVSMI_NO_GPU") == "1":
        print("No devices were found")
        return EXIT_NO_DEVICE
    try:
        return _main(args)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0


def _main(args: list[str]) -> int:
    if args and args[0] == "dmon":
        select, delay, count, dmon_ids = "pu", 1.0, None, None
        i = 1
        while i < len(args):
            a = args[i]
            if a == "-s":
                v, i = _opt(args, i, "-s")
                select = v or select
            elif a == "-d":
                v, i = _opt(args, i, "-d")
                delay = float(v or 1)
            elif a == "-c":
                v, i = _opt(args, i, "-c")
                count = int(v or 1)
            elif a == "-i":
                dmon_ids, i = _opt(args, i, "-i")
            else:
                print("Invalid combination of input arguments. Please run 'nvidia-smi dmon -h' for help.\n")
                return EXIT_INVALID_ARG
        return dmon(select, delay, count, dmon_ids)
    query: str | None = None
    apps: str | None = None
    fmt: set[str] = set()
    ids: str | None = None
    loop: float | None = None
    q = x = list_gpus = False
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu"):
            query, i = _opt(args, i, "--query-gpu")
        elif a.startswith("--query-compute-apps"):
            apps, i = _opt(args, i, "--query-compute-apps")
        elif a.startswith("--format"):
            v, i = _opt(args, i, "--format")
            fmt = {p.strip() for p in (v or "").split(",")}
        elif a in ("-i", "--id") or a.startswith("--id="):
            ids, i = _opt(args, i, "--id")
        elif a in ("-lms", "--loop-ms") or a.startswith(("-lms=", "--loop-ms=")):
            v, i = _opt(args, i, "-lms" if a.startswith("-lms") else "--loop-ms")
            loop = float(v or 1000) / 1000.0
        elif a in ("-l", "--loop") or a.startswith("--loop="):
            v, i = _opt(args, i, "--loop")
            loop = float(v or 5)
        elif a in ("-q", "--query"):
            q, i = True, i + 1
        elif a in ("-x", "--xml-format"):
            x, i = True, i + 1
        elif a in ("-L", "--list-gpus"):
            list_gpus, i = True, i + 1
        else:
            print('Invalid combination of input arguments. Please run "nvidia-smi -h" for help.\n')
            return EXIT_INVALID_ARG
    if list_gpus:
        for g in gpus_now():
            print(f"GPU {g.index}: {g.name} (UUID: {g.uuid})")
        return 0
    if q:
        if not x:
            print("kvscope-fake-nvidia-smi: only `-q -x` (XML) is simulated")
            return EXIT_INVALID_ARG
        sys.stdout.write(query_xml())
        return 0
    if query is None and apps is None:
        print(_summary())
        return 0
    if "csv" not in fmt:
        print('"--format" must be specified with --query-gpu/--query-compute-apps (e.g. --format=csv)\n')
        return EXIT_INVALID_ARG
    while True:
        if query is not None:
            rc, out = query_gpu([f.strip() for f in query.split(",") if f.strip()], fmt, ids)
        else:
            rc, out = query_apps([f.strip() for f in (apps or "").split(",") if f.strip()], fmt, ids)
        sys.stdout.write(out)
        sys.stdout.flush()
        if rc or loop is None:
            return rc
        time.sleep(loop)


def _summary() -> str:
    lines = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        f"NVIDIA-SMI {driver_version()} (kvscope fake: simulated readings)  Driver Version: {driver_version()}",
    ]
    for g in gpus_now():
        lines.append(
            f"|  {g.index}  {g.name:<32} | {g.memory_used // MIB:>6}MiB / {g.memory_total // MIB:>6}MiB "
            f"| {round(g.util * 100):>3}% |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
