"""Device state files shared between running sims and `kvscope-fake-nvidia-smi`.

Each sim writes `<state_dir>/sim-<pid>.json` about twice a second: the GPU it pretends to use, the
memory it reserved, cumulative PCIe bytes moved (rx = host->GPU = KV loads, tx = GPU->host = KV
stores) and busy seconds. The fake nvidia-smi sums the live files per GPU index. Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV_STATE_DIR = "KVSCOPE_SIM_STATE_DIR"


def default_state_dir() -> Path:
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else Path(tempfile.gettempdir()) / "kvscope-sim-state"


def write_state(state_dir: Path, data: dict[str, Any]) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"sim-{data['pid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_states(state_dir: Path | None = None) -> list[dict[str, Any]]:
    """Live sims' states (files of dead processes are ignored); garbage files are skipped."""
    d = state_dir or default_state_dir()
    out: list[dict[str, Any]] = []
    if not d.is_dir():
        return out
    for f in sorted(d.glob("sim-*.json")):
        try:
            data = json.loads(f.read_text())
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            out.append(data)
    return out


def engine_state(engine: Any, pid: int, port: int, gpu_index: int) -> dict[str, Any]:
    """The state record of one running engine (`engine` is a simulator.engine.Engine)."""
    cfg = engine.cfg
    dev = cfg.profile.device
    if cfg.kv_cache_memory_bytes is not None:
        reserved = cfg.profile.model.weights_bytes + dev.non_kv_bytes + cfg.pool_bytes
    else:
        reserved = int(dev.memory_total_bytes * cfg.gpu_memory_utilization)
    return {
        "pid": pid,
        "port": port,
        "gpu_index": gpu_index,
        "gpu_name": dev.name,
        "gpu_uuid": dev.uuid,
        "memory_total_bytes": dev.memory_total_bytes,
        "memory_reserved_bytes": min(reserved, dev.memory_total_bytes),
        "kv_pool_bytes": cfg.pool_bytes,
        "kv_pool_bytes_in_use": engine.pool_bytes_in_use(),
        "pcie_rx_bytes": engine.pcie_rx_bytes,
        "pcie_tx_bytes": engine.pcie_tx_bytes,
        "busy_seconds": engine.busy_seconds,
        "power_limit_w": dev.power_limit_w,
        "idle_power_w": dev.idle_power_w,
        "pcie_gen_max": dev.pcie_gen_max,
        "pcie_width_max": dev.pcie_width_max,
        "written_at": time.time(),
        "monotonic": time.monotonic(),
        "process_name": sys.executable,
        "simulated": True,
    }
