"""Issue 26's "Done means": the README's "Using it on your GPU box" command, run as written on the
simulator (`kvscope up --no-gpu -- kvscope sim ...`; only the ports and the data dir are this
test's own, plus the sim's time scale and offload-buffer folder), fills the instance page, the
worth verdict and a sizing curve of >= 5 points within two minutes; the typed profile flags are
the profile "as-started" the instance runs; "apply this size" from the sizing curve and a profile
created and applied through the API end healthy; an A/B of two profiles completes with a verdict.

Real processes (up, and the sim it supervises), a real SQLite file, the operator token file `up`
writes. The figures (time to first sample, to the curve, apply and A/B durations) are printed
for the record; nothing asserts on them."""

from __future__ import annotations

import re
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvscope.traffic import Mix, Traffic
from tests.kvscope.up.rig import UpRig, sim_listening
from tests.paths import REPO
from tests.ports import free_port
from tests.waits import wait_until

pytestmark = pytest.mark.slow
README = REPO / "README.md"


def readme_sim_command() -> list[str]:
    """The README's simulator line of "Using it on your GPU box", as argv."""
    section = README.read_text().split("## Using it on your GPU box", 1)[1].split("\n## ", 1)[0]
    lines = [ln for block in re.findall(r"```bash\n(.*?)```", section, re.S) for ln in block.splitlines()]
    line = next(ln for ln in lines if ln.startswith("kvscope up") and "kvscope sim" in ln)
    return shlex.split(line)


def as_this_tests(argv: list[str], sim_port: int, events_port: int, shm: Path) -> list[str]:
    """The README's argv with this test's ports; `kvscope up` and its options are the rig's."""
    i = argv.index("--")
    assert argv[:2] == ["kvscope", "up"] and "--no-gpu" in argv[:i]
    server = list(argv[i + 1 :])
    server[server.index("--port") + 1] = "{SIM_PORT}"
    server = [a.replace("tcp://127.0.0.1:5557", f"tcp://127.0.0.1:{events_port}") for a in server]
    return [*server, "--sim-time-scale", "5", "--sim-shm-dir", str(shm), "--uvicorn-log-level", "warning"]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[UpRig]:
    shm = Path("/dev/shm") / f"kvscope-up-{tmp_path.name}"
    server = as_this_tests(readme_sim_command(), 0, free_port(), shm)
    r = UpRig(tmp_path, server)
    try:
        r.wait_ready()
        yield r
    finally:
        rc = r.stop()
        shutil.rmtree(shm, ignore_errors=True)
        assert rc == 0, r.output()
        assert not sim_listening(r.sim_url), "Ctrl-C left the supervised server running"


def _sizes(rig: UpRig, iid: int) -> list[Any]:
    return [p for p in rig.get(f"/api/v1/instances/{iid}/sizing").get("sizes") or [] if p.get("reload_tokens")]


def _worth(rig: UpRig, iid: int) -> Any:
    s = rig.get(f"/api/v1/instances/{iid}/summary", range="5m")
    w = s.get("worth") or {}
    return w if w.get("tone") in ("good", "bad") else None


def _profile(rig: UpRig, name: str, spec: dict[str, Any]) -> None:
    r = rig.post("/api/v1/profiles", {"name": name, "spec": spec})
    assert r.status_code == 201, r.text


def test_the_readme_rig_fills_its_pages_applies_a_profile_and_runs_an_ab(rig: UpRig) -> None:
    t0 = rig.started
    inst = rig.instance()
    t_first = time.monotonic() - t0
    iid = int(inst["id"])
    traffic = Traffic(rig.sim_url, str(inst["model"]), mix=Mix(documents=8, document_words=1600), rate=6, seed=3)
    traffic.start()
    try:
        sizes = wait_until(
            lambda: (s := _sizes(rig, iid)) and len(s) >= 5 and s, "a sizing curve of 5 points", timeout=120
        )
        t_curve = time.monotonic() - t0
        worth = wait_until(lambda: _worth(rig, iid), "the worth verdict", timeout=max(1.0, 120 - t_curve))
        t_worth = time.monotonic() - t0
    finally:
        traffic.stop(timeout=10)
    assert len(sizes) >= 5 and worth["verdict"]
    # what it runs is the typed command's profile flags, stored as the profile "as-started"
    ip = wait_until(lambda: rig.get(f"/api/v1/instances/{iid}/profile")["current"], "the starting profile", 30)
    assert ip["name"] == "as-started"
    typed = rig.get("/api/v1/profiles/as-started")["argv"]
    assert "--kv-offloading-size" in typed and "--kv-events-config" in typed
    page = httpx.get(f"{rig.app_url}/instances/{iid}", headers=rig.auth, timeout=20)
    assert page.status_code == 200 and worth["verdict"].split(":")[0] in page.text and "n/a" not in worth["verdict"]
    # "apply this size": the typed profile plus the size, restarted at once
    r = rig.post(f"/api/v1/instances/{iid}/sizing/profile", {"offload_gib": 0.5, "request_rollout": True})
    assert r.status_code == 201, r.text
    sized = rig.wait_rollout(int(r.json()["rollout_id"]))
    assert sized["state"] == "healthy", sized
    argv = rig.pid_file()["argv"]
    assert argv[argv.index("--kv-offloading-size") + 1] == "0.5" and "--kv-events-config" in argv
    assert argv[argv.index("--max-model-len") + 1] == "4096"  # the rest of the typed profile kept
    # a profile of one's own replaces the typed flags without repeating any
    pool = {"kv_cache_memory_bytes": 1073741824, "max_model_len": 4096}
    events = {"endpoint": re.search(r"tcp://127\.0\.0\.1:\d+", " ".join(rig.pid_file()["argv"])).group(0)}  # type: ignore[union-attr]
    _profile(rig, "offload-1g", {**pool, "offload_size_gib": 1, "kv_events": events})
    _profile(rig, "gpu-only", {**pool, "kv_events": events})
    a0 = time.monotonic()
    r = rig.post("/api/v1/rollouts", {"instance": iid, "profile": "offload-1g"})
    assert r.status_code == 201, r.text
    done = rig.wait_rollout(int(r.json()["id"]))
    t_apply = time.monotonic() - a0
    assert done["state"] == "healthy", done
    argv = rig.pid_file()["argv"]
    assert argv.count("--kv-offloading-size") == 1 and argv.count("--max-model-len") == 1, argv
    assert argv.count("--port") == 1 and "--sim-time-scale" in argv  # the base command is kept
    b0 = time.monotonic()
    r = rig.post(
        "/api/v1/experiments",
        {
            "instance": iid,
            "b": "gpu-only",
            "runs": 2,  # the fewest the A/B takes
            "workload": {"kind": "probe", "prefix_tokens": 1500, "evict_prefixes": 2, "repetitions": 1},
        },
    )
    assert r.status_code == 201, r.text
    eid = int(r.json()["id"])
    exp = wait_until(
        lambda: (e := rig.get(f"/api/v1/experiments/{eid}")) and e["finished"] and e,
        "the A/B experiment to finish",
        timeout=300,
        interval=0.5,
    )
    t_ab = time.monotonic() - b0
    assert exp["state"] == "completed", exp["message"]
    assert exp["profile_a"] == "offload-1g" and exp["verdict"] and exp["verdict"]["summary"]
    assert rig.get(f"/api/v1/instances/{iid}/profile")["current"]["name"] == "offload-1g"  # back on A
    print(
        f"\nkvscope up -- kvscope sim: first sample {t_first:.1f} s, sizing curve ({len(sizes)} points) "
        f"{t_curve:.1f} s, worth verdict {t_worth:.1f} s after start; apply {t_apply:.1f} s; "
        f"A/B (2 runs per arm, probe) {t_ab:.1f} s"
    )
