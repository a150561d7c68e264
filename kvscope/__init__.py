"""kvscope: see and steer vLLM's KV-cache offloading."""

__version__ = "0.1.0"
