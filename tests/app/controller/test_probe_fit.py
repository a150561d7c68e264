"""The probe sizes its prefix to the server's context length."""

from __future__ import annotations

import httpx

from agent.probe import ProbeConfig, fit_prefix_words, run_probe


def test_fit_prefix_words() -> None:
    assert fit_prefix_words(1500, None, 16) == 1500
    assert fit_prefix_words(1500, 32768, 16) == 1500
    assert fit_prefix_words(1500, 2048, 16) == 897  # (0.9 x 2048 - 16 - 32) / 2
    assert fit_prefix_words(1500, 40, 16) == 16


def test_probe_prompts_fit_a_small_context() -> None:
    lengths: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "root": "/m", "max_model_len": 2048}]})
        if req.url.path == "/v1/completions":
            import json

            prompt = json.loads(req.content)["prompt"]
            lengths.append(len(prompt.split()))
            return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1}})
        if req.url.path == "/metrics":
            return httpx.Response(200, text="")
        return httpx.Response(404)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    run_probe("http://vllm", config=ProbeConfig(prefix_words=1500, evict_count=2), client=client)
    assert lengths and max(lengths) <= 897 + 16  # prefix words + header and question
