"""Clients of each kind for the security tests: anonymous, and one per role (API tokens)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import api_token


@pytest.fixture
def anon(app: Any) -> Iterator[Any]:
    """A client with no credentials at all."""
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        yield c


@pytest.fixture
def as_role(app: Any) -> Iterator[Callable[[str], Any]]:
    """as_role("viewer") -> a client acting with a fresh viewer API token."""
    from fastapi.testclient import TestClient

    clients: list[Any] = []

    def make(role: str) -> Any:
        c = TestClient(app)
        c.__enter__()
        c.headers["Authorization"] = "Bearer " + api_token(app.state.ctx.engine, role)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)
