"""The xdist work units: the real-vLLM tests form two (the controller stack's module, and every
other module with the worker's one-at-a-time server pool); every other test is a unit of its own."""

from __future__ import annotations

from tests.scheduling import group_of


def test_the_controller_stack_tests_fall_in_one_work_unit() -> None:
    ids = [
        "tests/realvllm/test_controller_real.py::test_dtype_switch_then_rejected_profile_rolls_back",
        "tests/realvllm/test_controller_real.py::test_rollback_names_vllm_error",
        "tests/realvllm/test_controller_real.py::test_dashboard_in_chromium_with_the_real_server",
    ]
    assert {group_of(i) for i in ids} == {"realvllm-controller"}


def test_every_other_real_vllm_test_falls_in_one_work_unit() -> None:
    ids = [
        "tests/realvllm/test_sizing_real.py::test_unbounded_tier_prediction_matches_the_disk_tier_reloads",
        "tests/realvllm/test_agent_reads_real.py::test_capture[tiny]",
        "tests/realvllm/test_external_tier_real.py::test_capture_with_the_external_tier",
        "tests/realvllm/test_fp8_refusal_real.py::test_fp8_is_refused_with_vllms_own_words_on_a_cpu_without_avx512",
    ]
    assert {group_of(i) for i in ids} == {"realvllm"}


def test_any_other_test_is_a_unit_of_its_own() -> None:
    ids = [
        "tests/app/storage/test_rollups.py::test_a[sqlite]",
        "tests/browser/test_login.py::test_b",
        "tests/realvllmx.py::t",
    ]
    assert [group_of(i) for i in ids] == ids


class _Node:
    """What the scheduler needs of an xdist worker: it records the tests it is sent."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[int] = []
        self.shutdown_called = False
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutdown_called = True


class _Option:
    loadscopereorder = True


class _Config:
    option = _Option()

    def getvalue(self, name: str) -> object:
        return {"tx": ["2*popen"]}[name]


def test_the_two_real_vllm_units_go_first_one_to_each_worker() -> None:
    from tests.scheduling import GroupScheduling

    collection = [
        "tests/app/test_a.py::test_one",
        "tests/realvllm/test_agent_reads_real.py::test_reads",
        "tests/realvllm/test_controller_real.py::test_dtype",
        "tests/realvllm/test_controller_real.py::test_ab",
        "tests/realvllm/test_sizing_real.py::test_sizing",
        "tests/realvllm/test_fp8_refusal_real.py::test_refused",
        "tests/app/test_b.py::test_two",
        "tests/app/test_c.py::test_three",
    ]
    sched = GroupScheduling(_Config())  # type: ignore[arg-type]
    nodes = [_Node("gw0"), _Node("gw1")]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        sched.add_node_collection(node, collection)  # type: ignore[arg-type]
    sched.schedule()
    first = [[collection[i] for i in node.sent] for node in nodes]
    # gw0 starts with the pool's unit (3 tests, the bigger one), gw1 with the controller stack's
    assert first[0][:3] == [collection[1], collection[4], collection[5]]
    assert first[1][:2] == [collection[2], collection[3]]
    assert not any(n.shutdown_called for n in nodes)
