"""Traffic drivers for A/B runs, through vLLM's OpenAI API: probe, prefix-repetition, replay, observe.

Standard library + httpx only, so they run on either side: next to vLLM on the agent, or in the
app when it reaches vLLM directly. `agent.workloads.runner.execute_run` does one bracketed run:
reset caches, warm up, counter snapshot, the workload, counter snapshot.
"""

from agent.workloads.spec import WORKLOAD_KINDS, WorkloadSpec, parse_workload

__all__ = ["WORKLOAD_KINDS", "WorkloadSpec", "parse_workload"]
