"""kvscope: see and steer vLLM's KV-cache offloading."""

from importlib.metadata import PackageNotFoundError, version

try:  # the one place the version lives is the package metadata (pyproject.toml)
    __version__ = version("kvscope")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"
