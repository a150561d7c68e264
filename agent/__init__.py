"""kvscope agent: runs beside `vllm serve`, reads vLLM, GPUs and host memory, pushes to the app.

Light by design: only httpx, prometheus-client and nvidia-ml-py; never the app's stack.
"""

from kvscope import __version__ as __version__  # package metadata, one place
