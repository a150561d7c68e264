"""The rows ab_store returns: one typed definition per kind of row, so mypy checks the keys a
consumer reads. They stay plain dicts at run time (pages and JSON use them as they are).
JSON columns (workload, options, verdict, record, summary) are dict[str, Any]: their shape is the
workload runner's and the verdict's, not the table's."""

from __future__ import annotations

from typing import Any, TypedDict


class ExperimentRow(TypedDict):
    """An experiment with its instance and host (get_experiment, list_experiments ...)."""

    id: int
    instance_id: int
    profile_a: str
    profile_b: str
    version_a_id: int | None
    version_b_id: int | None
    previous_version_id: int | None
    workload: dict[str, Any]
    options: dict[str, Any]
    runs_per_arm: int
    seed: int
    state: str
    step: str
    current_run: int
    outcome: str | None
    message: str
    rollout_id: int | None
    step_started_at: float | None
    owner: str | None
    lease_until: float | None
    verdict: dict[str, Any]
    requested_by: str
    created_at: float
    updated_at: float
    finished_at: float | None
    instance_url: str
    host_id: int
    host: str
    simulated: bool


class RunRow(TypedDict):
    """One run of an experiment (list_runs, get_run)."""

    id: int
    experiment_id: int
    idx: int
    arm: str
    version_id: int | None
    state: str
    rollout_id: int | None
    argv: list[str]
    started_at: float | None
    finished_at: float | None
    record: dict[str, Any]
    summary: dict[str, Any]
    message: str
