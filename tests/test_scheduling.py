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


def _scheduled(collection: list[str], workers: int = 2) -> tuple[list[list[str]], list[str]]:
    """What each worker is sent when the run starts, and the work units left in the queue."""
    from tests.scheduling import GroupScheduling

    sched = GroupScheduling(_Config())  # type: ignore[arg-type]
    nodes = [_Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        sched.add_node_collection(node, collection)  # type: ignore[arg-type]
    sched.schedule()
    return [[collection[i] for i in node.sent] for node in nodes], list(sched.workqueue)


def test_the_slow_files_go_next_longest_first_and_the_short_tests_last() -> None:
    collection = [
        "tests/ab/test_calibration.py::test_a_vs_a",
        "tests/app/test_a.py::test_one",
        "tests/app/test_b.py::test_two",
        "tests/rig/test_reboot.py::test_a_reboot",
        "tests/simulator/test_calibration.py::test_fits",  # not the slow one of that name
        "tests/app/sizing/test_up_follows_kv_events.py::test_up",  # found after a move too
    ]
    first, queued = _scheduled(collection)
    # each worker starts on a slow test, longest first, and is sent the next unit as it runs
    assert first == [[collection[3], collection[0]], [collection[5], collection[1]]]
    assert queued == [collection[2], collection[4]]  # the short ones, in collection order


def test_every_slow_file_named_for_the_scheduler_is_in_the_suite() -> None:
    """A slow file renamed or removed would silently go back to its place in collection order."""
    from pathlib import Path

    from tests.scheduling import SLOW_FILES

    tests = Path(__file__).resolve().parent
    files = ["/" + str(p.relative_to(tests)) for p in tests.rglob("test_*.py")]
    for tail in SLOW_FILES:
        assert [f for f in files if f.endswith("/" + tail)], f"no tests/**/{tail}: update tests/scheduling.py"
