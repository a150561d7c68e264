"""What every workload driver gets: where to send, how to time, when to stop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.workloads.completions import RequestResult, send_completion
from agent.workloads.spec import WorkloadSpec


class Cancelled(Exception):
    """The run was cancelled between two requests."""


@dataclass
class RunContext:
    client: httpx.Client
    base_url: str
    model: str | None
    spec: WorkloadSpec
    run_key: str  # unique per run: prompts of two runs never share a prefix
    cancelled: Callable[[], bool] = lambda: False
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    t0: float = 0.0
    results: list[RequestResult] = field(default_factory=list)
    pool_tokens: int | None = None  # the GPU KV pool in tokens (cache_config_info), when known
    tiers: list[dict[str, Any]] = field(default_factory=list)  # offload tiers and their tokens (snapshot)
    block_tokens: int = 16  # the GPU block size (cache_config_info)
    max_model_len: int | None = None
    notes: dict[str, object] = field(default_factory=dict)  # what the driver decided (e.g. auto sizes)

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled("cancelled")

    def send(self, prompt: str, tag: str, max_tokens: int | None = None) -> RequestResult:
        res = send_completion(
            self.client,
            self.base_url,
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens or self.spec.max_tokens,
            stream=self.spec.stream,
            timeout_s=self.spec.request_timeout_s,
            tag=tag,
            clock=self.clock,
            run_t0=self.t0,
        )
        self.results.append(res)
        return res
