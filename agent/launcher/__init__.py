"""Launchers: how the agent restarts one vLLM instance with a profile's flags.

- `subprocess`: the agent starts and supervises the command itself (`vllm serve`, `kvscope sim` ...);
- `systemd`: a drop-in (or EnvironmentFile) for a named unit, then `systemctl restart`;
- `docker`: the named container is recreated with the new args through the Engine API socket.

All share the `Launcher` protocol (agent.launcher.base); `wait_healthy` (agent.launcher.health)
is the same for all of them.
"""

from agent.launcher.base import Launcher, LauncherError
from agent.launcher.health import HealthResult, wait_healthy

__all__ = ["HealthResult", "Launcher", "LauncherError", "wait_healthy"]
