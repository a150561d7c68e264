"""The xdist work units: the real-vLLM tests share one (one vLLM at a time), others are alone."""

from __future__ import annotations

from tests.scheduling import group_of


def test_every_real_vllm_test_falls_in_one_work_unit() -> None:
    ids = [
        "tests/realvllm/test_controller_real.py::test_rollback_names_vllm_error",
        "tests/realvllm/test_sizing_real.py::test_unbounded_tier_prediction_matches_the_disk_tier_reloads",
        "tests/realvllm/test_agent_reads_real.py::test_capture[tiny]",
    ]
    assert {group_of(i) for i in ids} == {"realvllm"}


def test_any_other_test_is_a_unit_of_its_own() -> None:
    ids = ["tests/app/test_rollups.py::test_a[sqlite]", "tests/browser/test_login.py::test_b", "tests/realvllmx.py::t"]
    assert [group_of(i) for i in ids] == ids
