"""The JSON API, the pages (forms with CSRF, htmx progress, result charts), export, keep A/B, and
`kvscope ab` against the real app in-process."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest

from app.ab import cli as ab_cli
from app.ab.orchestrator import Limits, Orchestrator
from app.ab.ports import RolloutsPort
from app.storage import rollouts_store as rs
from kvscope.app_client import AppClient
from kvscope.errors import UserError
from tests.app.ab.conftest import SPEC, ModelExecutor, agent_step

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def model_orch(setup: dict[str, Any]) -> Orchestrator:
    ctx = setup["ctx"]
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ModelExecutor(ctx, setup["iid"]), Limits(n_boot=300))
    ctx.set_state(orch)  # what the API's cancel and the tick job use
    return orch


def _finish(orch: Orchestrator, setup: dict[str, Any], clock: Any, eid: int) -> None:
    ctx = setup["ctx"]
    for _ in range(100):
        orch.tick(clock())
        agent_step(ctx, setup["host_id"], clock())
        clock.advance(1.0)
        from app.storage.ab_store import get_experiment

        exp = get_experiment(ctx.engine, eid)
        if exp and exp["finished_at"] is not None:
            return
    raise AssertionError("not finished")


def test_api_create_errors(client: Any, setup: dict[str, Any]) -> None:
    iid = setup["iid"]
    r = client.post("/api/v1/experiments", content=json.dumps({"instance": iid, "b": "x"}))
    assert r.status_code == 415
    cases = [
        ({"instance": iid, "b": "nope"}, 404, "no profile named 'nope'"),
        ({"instance": "x", "b": "offload-0.5"}, 422, "instance must be"),
        ({"instance": 999, "b": "offload-0.5"}, 404, "no instance 999"),
        ({"instance": iid, "b": "offload-0.5", "workload": {"kind": "probe", "repetitions": 0}}, 422, "repetitions"),
        ({"instance": iid, "b": "offload-0.5", "workload": {"kind": "replay"}}, 422, "trace_path"),
        ({"instance": iid, "b": "offload-0.5", "runs": 99}, 422, "runs per arm"),
        ({"instance": iid, "b": "offload-0.5", "runs": 1}, 422, "a verdict needs at least 3"),
        ({"instance": iid, "b": "offload-0.5", "executor": "gpu"}, 422, "executor must be auto, app or agent"),
        (
            {"instance": iid, "b": "offload-0.5", "workload": {"kind": "replay", "trace_path": "/etc/passwd"}},
            422,
            "not trace_path",
        ),
        ([1, 2], 422, "JSON object"),
    ]
    for body, status, msg in cases:
        r = client.post("/api/v1/experiments", json=body)
        assert r.status_code == status, (body, r.text)
        assert msg in r.json()["error"]
    r = client.post("/api/v1/experiments", content=b"{not json", headers=JSON)
    assert r.status_code == 400
    assert client.get("/api/v1/experiments/12345").status_code == 404
    assert client.post("/api/v1/experiments/12345/cancel", json={}).status_code == 409
    assert client.get("/experiments/12345", headers={"accept": "text/html"}).status_code == 404


def test_api_run_export_and_keep(client: Any, setup: dict[str, Any], model_orch: Orchestrator, clock: Any) -> None:
    iid = setup["iid"]
    r = client.post(
        "/api/v1/experiments", json={"instance": iid, "b": "offload-0.5", "runs": 3, "seed": 3, "workload": SPEC}
    )
    assert r.status_code == 201, r.text
    exp = r.json()
    assert exp["state"] == "pending" and exp["profile_a"] == "no-offload" and exp["progress"]["runs_done"] == 0
    eid = exp["id"]
    r = client.post(f"/api/v1/experiments/{eid}/keep", json={"arm": "B"})
    assert r.status_code == 409 and "still running" in r.json()["error"]
    _finish(model_orch, setup, clock, eid)
    exp = client.get(f"/api/v1/experiments/{eid}").json()
    assert exp["state"] == "completed" and exp["finished"] and exp["progress"]["fraction"] == 1.0
    assert exp["verdict"]["call"] == "B is better"
    assert [r["arm"] for r in exp["runs"]] == ["A", "B"] * 3
    assert exp["plan"]["primary"]["label"] == "TTFT p50 on evicted prefixes" and not exp["quick_look"]
    assert "record" not in exp["runs"][0]
    assert client.get("/api/v1/experiments", params={"instance": iid}).json()["experiments"][0]["id"] == eid

    j = client.get(f"/api/v1/experiments/{eid}/export.json")
    assert j.status_code == 200 and "attachment" in j.headers["content-disposition"]
    data = j.json()
    assert len(data["runs"]) == 6 and data["runs"][1]["record"]["requests"]
    c = client.get(f"/api/v1/experiments/{eid}/export.csv")
    rows = list(csv.DictReader(io.StringIO(c.text)))
    assert [row["arm"] for row in rows] == ["A", "B"] * 3
    assert rows[1]["profile"] == "offload-0.5" and "--kv-offloading-size 0.5" in rows[1]["argv"]
    assert float(rows[1]["share_external_kv_transfer"]) > 0 and float(rows[0]["share_external_kv_transfer"]) == 0
    assert float(rows[1]["focus_ttft_p50_ms"]) < float(rows[0]["focus_ttft_p50_ms"])

    r = client.post(f"/api/v1/experiments/{eid}/keep", json={"arm": "C"})
    assert r.status_code == 422
    r = client.post(f"/api/v1/experiments/{eid}/keep", json={"arm": "B"})
    assert r.status_code == 201
    ro = rs.get_rollout(setup["ctx"].engine, r.json()["rollout_id"])
    assert ro is not None and ro["profile"] == "offload-0.5" and ro["state"] == "requested"
    assert "keep B" in ro["requested_by"]


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no csrf field in the form"
    return m.group(1)


def test_pages_start_progress_result_cancel(
    client: Any, setup: dict[str, Any], model_orch: Orchestrator, clock: Any
) -> None:
    iid = setup["iid"]
    page = client.get(f"/instances/{iid}/experiment")
    assert page.status_code == 200 and "Start A/B" in page.text
    assert "<option selected>no-offload</option>" in page.text.replace("\n", "")
    token = _csrf(page.text)
    origin = {"origin": "http://testserver"}
    r = client.post("/experiments", data={"instance": str(iid), "b": "nope", "csrf": token}, headers=origin)
    assert r.status_code == 404 and "no profile named" in r.text
    r = client.post("/experiments", data={"instance": str(iid), "b": "offload-0.5", "csrf": "bad"}, headers=origin)
    assert r.status_code == 403
    r = client.post(
        "/experiments",
        data={
            "instance": str(iid),
            "b": "offload-0.5",
            "runs": "3",
            "kind": "probe",
            "prefix_tokens": "1500",
            "evict_prefixes": "2",
            "repetitions": "3",
            "csrf": token,
        },
        headers=origin,
        follow_redirects=False,
    )
    assert r.status_code == 303
    url = r.headers["location"]
    eid = int(url.rsplit("/", 1)[1])
    running = client.get(url)
    assert running.status_code == 200 and 'hx-trigger="every 1s"' in running.text
    assert "Cancel" in running.text
    frag = client.get(f"{url}/progress")
    assert frag.status_code == 200 and "ab-progress" in frag.text and "HX-Refresh" not in frag.headers
    _finish(model_orch, setup, clock, eid)
    done = client.get(url)
    assert "Verdict: B is better" in done.text
    assert "Plan (fixed before the first run)" in done.text and "TTFT p50 on evicted prefixes" in done.text
    assert "restart #" in done.text and "foreign traffic" in done.text and "probe sizing" in done.text
    assert 'data-ab-figure="figdata-ttft-cdf"' in done.text and "keep B" in done.text
    assert 'hx-trigger="every 1s"' not in done.text
    assert client.get(f"{url}/progress").headers.get("HX-Refresh") == "true"
    listing = client.get("/experiments")
    assert f'href="/experiments/{eid}"' in listing.text
    r = client.post(
        f"/experiments/{eid}/keep", data={"arm": "A", "csrf": _csrf(done.text)}, headers=origin, follow_redirects=False
    )
    assert r.status_code == 303 and r.headers["location"].startswith("/rollouts/")


def test_cli_runs_an_experiment_to_the_verdict(
    client: Any, setup: dict[str, Any], model_orch: Orchestrator, clock: Any, monkeypatch: Any, capsys: Any
) -> None:
    def ticking_client(args: Any) -> AppClient:
        return AppClient("http://testserver", None, "the test client's session", http=client)

    def follow(c: Any, eid: int, poll: float) -> dict[str, Any]:
        _finish(model_orch, setup, clock, eid)
        return ab_cli._call(c, "GET", f"/api/v1/experiments/{eid}")

    monkeypatch.setattr(ab_cli, "_client", ticking_client)
    monkeypatch.setattr(ab_cli, "follow", follow)
    from kvscope.cli import main

    rc = main(
        [
            "ab",
            "--instance",
            str(setup["iid"]),
            "--b",
            "offload-0.5",
            "--runs",
            "2",
            "--prefix-tokens",
            "1500",
            "--repetitions",
            "3",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    # two runs per arm: a quick look, said before the runs and in the verdict, never a winner
    assert "quick look" in out.err and "primary metric: TTFT p50 on evicted prefixes" in out.err
    assert "inconclusive: too few runs" in out.out and "B is better" not in out.out
    eid = client.get("/api/v1/experiments").json()["experiments"][0]["id"]
    page = client.get(f"/experiments/{eid}").text
    assert "2 runs per arm: a quick look" in page and "Verdict: inconclusive: too few runs" in page
    assert "not called: too few runs" in page
    assert "run 2 B done" in out.out and "observed, not a verdict" in out.out
    assert "after the runs: back to no-offload, the profile the instance runs now" in out.err
    assert "back to no-offload, the profile the instance runs now" in page
    rc = main(["ab", "--instance", str(setup["iid"]), "--b", "nope"])
    assert rc != 0 and "no profile named 'nope'" in capsys.readouterr().err
    rc = main(["ab", "--instance", str(setup["iid"])])
    assert rc != 0 and "--b PROFILE" in capsys.readouterr().err


def test_an_instance_never_switched_by_kvscope_is_told_before_any_run_that_it_stays_on_b(
    client: Any, token: str, batch_factory: Any, clock: Any
) -> None:
    """An instance its launcher started with its own flags has no profile to go back to: the plan
    says so before the first run (API, page), instead of the experiment leaving it on B unsaid."""
    r = client.post("/api/v1/ingest", json=batch_factory(1, clock()), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    for name, spec in (("no-offload", {}), ("offload-0.5", {"offload_size_gib": 0.5})):
        assert client.post("/api/v1/profiles", json={"name": name, "spec": spec}).status_code == 201
    assert client.get(f"/api/v1/instances/{iid}/profile").json()["current"] is None
    r = client.post("/api/v1/experiments", json={"instance": iid, "a": "no-offload", "b": "offload-0.5"})
    assert r.status_code == 201, r.text
    after = r.json()["after"]
    assert "launcher's own flags" in after and "stays on the last run's profile (offload-0.5" in after, after
    assert "apply a profile first" in after
    page = client.get(f"/experiments/{r.json()['id']}").text
    assert "after the runs" in page and "launcher&#39;s own flags" in page


def test_cli_pieces(tmp_path: Any) -> None:
    assert ab_cli.bar(3, 6, width=6) == "[###...] 3/6 runs"
    assert ab_cli.bar(0, 0, width=2) == "[..] 0/0 runs"
    import argparse

    ns = argparse.Namespace(
        workload="replay", trace=tmp_path / "missing.jsonl", **{n: None for n, _t, _h in ab_cli.WORKLOAD_OPTS}
    )
    with pytest.raises(UserError, match="cannot read trace"):
        ab_cli.workload_from_args(ns)
    (tmp_path / "t.jsonl").write_text('{"prompt": "hello there", "offset_s": 0.5}\n\n{"prompt": "again"}\n')
    ns.trace = tmp_path / "t.jsonl"
    ns.concurrency = 2
    wl = ab_cli.workload_from_args(ns)
    assert wl["records"] == [{"prompt": "hello there", "offset_s": 0.5}, {"prompt": "again"}]
    assert wl["concurrency"] == 2 and "stream" not in wl
    probe = argparse.Namespace(workload="probe", stream=False, **{n: None for n, _t, _h in ab_cli.WORKLOAD_OPTS})
    assert ab_cli.workload_from_args(probe) == {"kind": "probe", "stream": False}  # --no-stream: the field's method
    with (
        pytest.raises(UserError, match="cannot reach the kvscope app"),
        AppClient("http://127.0.0.1:9", None, "no token") as c,
    ):
        ab_cli._call(c, "GET", "/api/v1/experiments")


def test_default_executor() -> None:
    from app.ab.service import default_executor

    assert default_executor("http://127.0.0.1:8000", "gpu-box", this_host="home") == "agent"
    assert default_executor("http://localhost:8000", "gpu-box", this_host="home") == "agent"
    assert default_executor("http://[::1]:8000", "gpu-box", this_host="home") == "agent"
    assert default_executor("http://127.0.0.1:8000", "home", this_host="home") == "app"
    assert default_executor("http://10.0.0.5:8000", "gpu-box", this_host="home") == "agent"
    assert default_executor("http://gpu-box:8000", "gpu-box", this_host="home") == "agent"
