"""Any request body gets an answer with vLLM's error shape (or a completion): never a traceback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.simulator.simdrive import app, client

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 3000), st.floats(allow_nan=False), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
bodies = st.dictionaries(
    st.sampled_from(
        [
            "prompt",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "stream",
            "stream_options",
            "model",
            "n",
            "temperature",
            "x",
        ]
    ),
    values,
    max_size=6,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    body=bodies,
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)
def test_garbage_in_gets_a_shaped_answer(path: str, body: dict[str, Any], raw: bytes | None) -> None:
    async def go() -> None:
        a = app("--profile", "tiny", "--max-model-len", "512")
        try:
            async with client(a) as c:
                content = raw if raw is not None else json.dumps(body).encode()
                r = await c.post(path, content=content, headers={"content-type": "application/json"})
                assert r.headers["x-kvscope-simulated"] == "1"
                if r.status_code == 200:
                    if r.headers["content-type"].startswith("text/event-stream"):
                        assert r.text.rstrip().endswith("data: [DONE]")
                    else:
                        assert r.json()["usage"]["completion_tokens"] >= 1
                else:
                    assert r.status_code in (400, 404), r.text
                    err = r.json()["error"]
                    assert isinstance(err["message"], str) and err["code"] == r.status_code
        finally:
            await a.stop()

    asyncio.run(go())
