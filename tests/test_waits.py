"""tests/waits.py: wait_until returns what the condition gave, names what it waited for, and gives
up at once when told the thing it waits on is gone."""

from __future__ import annotations

import itertools

import pytest

from tests.waits import wait_until


def test_wait_until_returns_the_first_truthy_answer_retrying_errors() -> None:
    calls = itertools.count()

    def third_time() -> int:
        n = next(calls)
        if n == 0:
            raise ConnectionError("not up yet")
        return n if n >= 2 else 0

    assert wait_until(third_time, "the third call", interval=0.0) == 2


def test_wait_until_names_what_it_waited_for_and_the_last_error() -> None:
    def never() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match=r"waiting for the server .*refused"):
        wait_until(never, "the server", timeout=0.0, interval=0.0)


def test_an_abort_message_fails_before_the_timeout() -> None:
    tries = []
    with pytest.raises(AssertionError, match="gave up waiting for the app: its thread ended"):
        wait_until(
            lambda: tries.append(1), "the app", timeout=3600.0, abort=lambda: "its thread ended" if tries else None
        )
    assert len(tries) == 1
