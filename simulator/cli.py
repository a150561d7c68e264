"""`kvscope sim`: a simulated GPU vLLM server. Standard library only at module level."""

from __future__ import annotations

import argparse
from typing import Any

from simulator.config import add_vllm_arguments


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="run a simulated vLLM server (cost model + cache simulation; everything it reports is simulated)",
        description=(
            "A stand-in for `vllm serve` on a GPU: same flags, endpoints and /metrics, driven by a cost model "
            "and a real block-cache simulation. Unknown flags are rejected the way vLLM rejects them."
        ),
    )
    add_vllm_arguments(p)
    p.add_argument(
        "--kv-events-config",
        default=None,
        help="vLLM's KV-event publisher config (JSON): publish the simulated prefix cache's events over ZMQ",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from simulator.runner import run

    return run(args)
