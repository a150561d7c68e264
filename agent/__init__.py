"""kvscope agent: runs beside `vllm serve`, reads vLLM, GPUs and host memory, pushes to the app.

Light by design: only httpx, prometheus-client and nvidia-ml-py; never the app's stack.
"""

__version__ = "0.1.0"
