"""Engine options in the instance URL's fragment: read, and refused with a message when wrong."""

from __future__ import annotations

import pytest

from agent.engines import ENGINES
from agent.engines.options import MAX_BLOCK_SIZE, MAX_FRAGMENT, EngineOptions, split_url
from kvscope.errors import UserError

NAMES = tuple(ENGINES)


def test_a_url_without_a_fragment_has_no_options() -> None:
    assert split_url("http://h:8000/", NAMES) == ("http://h:8000", EngineOptions())
    assert split_url("http://h:8000#", NAMES) == ("http://h:8000", EngineOptions())


def test_engine_block_size_and_metrics_path_are_read_and_the_fragment_is_not_part_of_the_name() -> None:
    base, opts = split_url("http://h:6880#engine=dynamo-kvbm&block_size=16&metrics_path=/m", NAMES)
    assert base == "http://h:6880"
    assert opts == EngineOptions("dynamo-kvbm", 16, "/m")


@pytest.mark.parametrize(
    ("fragment", "message"),
    [
        ("engine=vlm", "unknown engine 'vlm'"),
        ("engin=sglang", "unknown engine option 'engin'"),
        ("block_size=0", "block_size must be"),
        ("block_size=-4", "block_size must be"),
        ("block_size=1.5", "block_size must be"),
        (f"block_size={MAX_BLOCK_SIZE + 1}", "block_size must be"),
        ("metrics_path=metrics", "metrics_path must be"),
        ("metrics_path=/a?b", "metrics_path must be"),
        ("engine=sglang&engine=vllm", "given twice"),
        ("a=1&b=2&c=3&d=4", "at most 3 engine options"),
        ("engine=" + "x" * MAX_FRAGMENT, f"limited to {MAX_FRAGMENT} characters"),
        ("justtext", "unknown engine option 'justtext'"),
        ("&&", "cannot read engine options"),
    ],
)
def test_a_bad_fragment_is_refused_with_a_message(fragment: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        split_url("http://h:1#" + fragment, NAMES)


def test_the_agent_cli_refuses_a_bad_fragment_before_starting() -> None:
    from agent.cli import _urls

    with pytest.raises(UserError, match="unknown engine 'nonesuch'"):
        _urls(["http://h:1#engine=nonesuch"])
