"""The evaluation job: every rule on every target, the state machine, and the stored transitions.

For each target (instance, or host for host rules) and enabled rule: load the series, run the pure
rule at `now`, decide the transition (app.alerts.state), and apply it with compare-and-set
(app.storage.alerts_store). Deliveries for fire/resolve are written in the same transaction as
the transition, so only the process whose CAS won queues notifications.

When an alert opens, its start is back-dated to the data time at which the condition began (the
rule is re-run at the scrape instants since the previous evaluation), so `for_s` counts data time
and the alert fires within one evaluation of the `for` window allowing it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from app.alerts import expected
from app.alerts.catalog import RULES, RuleSpec
from app.alerts.channels import snapshot
from app.alerts.delivery import RESEND_S
from app.alerts.inputs import SeriesInputs
from app.alerts.params import effective
from app.alerts.rule_io import RuleResult, TargetData
from app.alerts.series import SeriesMap, median_gap, sample_times
from app.alerts.silencing import is_silenced
from app.alerts.state import FIRING, PENDING, RESOLVED, Decision, OpenAlert, decide
from app.settings import AlertChannel
from app.storage import alerts_store as store
from app.storage.alert_rows import AlertRow
from app.storage.events import EventRow, list_events
from app.storage.series_store import list_hosts, list_instances

log = logging.getLogger("kvscope.alerts")
# A firing alert whose series stopped is resolved after this long without data: a quarter hour
# outlasts a restart (which the health rules report themselves)
NODATA_RESOLVE_S = 900.0


@dataclass(frozen=True)
class EvalConfig:
    interval_s: float = 15.0
    nodata_resolve_s: float = NODATA_RESOLVE_S
    base_url: str | None = None
    resend_s: float = RESEND_S  # re-send firing alerts to Alertmanager channels this often
    history_s: float = 90 * 86400.0  # resolved alerts older than this are pruned (hourly)
    started_at: float | None = None  # when this app started: silences count from then (rules_health)


@dataclass
class EvalReport:
    evaluated: int = 0
    opened: int = 0
    fired: int = 0
    resolved: int = 0
    lost_races: int = 0
    errors: list[str] = field(default_factory=list)
    results: dict[str, RuleResult] = field(default_factory=dict)


def alert_key(rule: str, scope: str, target_id: int) -> str:
    return f"{rule}|{scope}:{target_id}"


@dataclass
class Target:
    scope: str  # instance | host
    id: int
    host_id: int
    info: Mapping[str, Any]  # the InstanceRow, or for a host {host, last_push, instances}: rule_io.TargetData.info


class Evaluator:
    def __init__(
        self,
        engine: Engine,
        *,
        rule_settings: Mapping[str, Mapping[str, Any]],
        channels: Sequence[AlertChannel],
        config: EvalConfig,
        rules: Sequence[RuleSpec] = RULES,
    ) -> None:
        self.engine = engine
        self.rule_settings = rule_settings
        self.channels = list(channels)
        self.config = config
        self.rules = list(rules)
        self.inputs = SeriesInputs(engine)
        # per Alertmanager channel: (alert id -> last queued delivery time, alert ids with one unsent)
        self._refresh_state: dict[str, tuple[dict[int, float], set[int]]] = {}
        self._pruned_at = float("-inf")

    # ------------------------------------------------------------------ targets and data
    def targets(self) -> list[Target]:
        out: list[Target] = []
        instances = list_instances(self.engine)
        started = {"app_started_at": self.config.started_at}
        for inst in instances:
            out.append(Target("instance", int(inst["id"]), int(inst["host_id"]), {**inst, **started}))
        for host in list_hosts(self.engine):
            info = {
                "host": host["name"],
                "last_push": host["last_push"],
                "instances": [i for i in instances if i["host_id"] == host["id"]],
                **started,
            }
            out.append(Target("host", int(host["id"]), int(host["id"]), info))
        return out

    def load(self, target: Target, specs: Sequence[tuple[RuleSpec, dict[str, Any]]], now: float) -> TargetData:
        lookback: dict[str, float] = {}
        for spec, params in specs:
            for name in spec.metrics:
                lookback[name] = max(lookback.get(name, 0.0), spec.lookback_s(params))
        starts = {name: now - back for name, back in lookback.items()}
        if target.scope == "instance":
            by_name = self.inputs.get_many(starts, now, instance_id=target.id)
        else:
            by_name = self.inputs.get_many(starts, now, host_id=target.id)
        events: list[EventRow] = []
        if target.scope == "instance" and specs:
            longest = max(float(p.get("window_s", 0.0)) for _, p in specs)
            events = list_events(self.engine, instance_id=target.id, start=now - 2 * longest - 60, end=now, limit=200)
        series = SeriesMap(by_name)
        return TargetData(
            series=series,
            host_series=series if target.scope == "host" else SeriesMap(),
            info=target.info,
            events=events,
        )

    # ------------------------------------------------------------------ the job
    def run(self, now: float) -> EvalReport:
        report = EvalReport()
        overrides = store.all_overrides(self.engine)
        open_by_key = store.open_alerts(self.engine)
        resolved_at = store.last_resolved(self.engine)
        silences = store.active_silences(self.engine, now)
        # Read after the alert rows: a refresh queued by another process after that read makes
        # our CAS fail, one queued before it is visible here. So a refresh is queued once.
        self._refresh_state = {
            c.name: (store.last_delivery_times(self.engine, c.name), store.unsent_alert_ids(self.engine, c.name))
            for c in self.channels
            if c.kind == "alertmanager" and c.enabled
        }
        seen: set[str] = set()
        longest = max(
            (spec.lookback_s(effective(spec.name, self.rule_settings, None)) for spec in self.rules), default=0
        )
        try:
            changes = expected.load_windows(self.engine, now - longest, now)
        except Exception as exc:  # no controller / A/B tables: nothing is expected
            log.warning("alerts: reading kvscope's rollouts and experiments failed: %s", exc)
            changes = {}
        for target in self.targets():
            if target.scope == "instance":
                target.info = {**target.info, "kvscope_changes": changes.get(target.id, [])}
            specs: list[tuple[RuleSpec, dict[str, Any]]] = []
            for spec in self.rules:
                if spec.scope != target.scope:
                    continue
                ov = overrides.get((target.id, spec.name)) if target.scope == "instance" else None
                params = effective(spec.name, self.rule_settings, ov)
                if params.get("enabled", True):
                    specs.append((spec, params))
            if not specs:
                continue
            try:
                data = self.load(target, specs, now)
            except Exception as exc:  # storage trouble: skip this target, keep the others
                log.exception("alerts: loading %s %s failed", target.scope, target.id)
                report.errors.append(f"load {target.scope} {target.id}: {exc}")
                seen.update(alert_key(spec.name, target.scope, target.id) for spec, _ in specs)  # hold state
                continue
            for spec, params in specs:
                key = alert_key(spec.name, target.scope, target.id)
                seen.add(key)
                try:
                    self._one(
                        spec,
                        params,
                        target,
                        data,
                        now,
                        key,
                        open_by_key.get(key),
                        resolved_at.get(key),
                        silences,
                        report,
                    )
                except Exception as exc:  # one bad rule never stops the others
                    log.exception("alerts: rule %s on %s failed", spec.name, key)
                    report.errors.append(f"{key}: {exc}")
        self.inputs.forget_unread()
        if now - self._pruned_at >= 3600:
            self._pruned_at = now
            try:
                store.prune(self.engine, now - self.config.history_s)
            except Exception as exc:  # housekeeping never stops evaluation
                log.exception("alerts: pruning history failed")
                report.errors.append(f"prune: {exc}")
        # open alerts whose rule got disabled or whose target is gone
        for key, row in open_by_key.items():
            if key not in seen:
                self._apply(
                    row,
                    Decision("resolve", RESOLVED, now, "rule disabled or target removed"),
                    RuleResult(False, message="rule disabled or target removed"),
                    now,
                    silences,
                    report,
                )
        return report

    def _one(
        self,
        spec: RuleSpec,
        params: dict[str, Any],
        target: Target,
        data: TargetData,
        now: float,
        key: str,
        row: AlertRow | None,
        last_resolved_at: float | None,
        silences: Sequence[Mapping[str, Any]],
        report: EvalReport,
    ) -> None:
        result = spec.func(data, now, params)
        report.evaluated += 1
        report.results[key] = result
        current = None
        if row is not None:
            current = OpenAlert(row["state"], float(row["opened_at"]), float(row["since"]), float(row["last_eval"]))
        active_since = None
        if current is None and result.active is True:
            active_since = result.since if result.since is not None else self._backdate(spec, params, data, now)
        decision = decide(
            current,
            result,
            now,
            params,
            last_resolved_at=last_resolved_at,
            active_since=active_since,
            nodata_resolve_s=self.config.nodata_resolve_s,
        )
        if decision.action == "none":
            return
        if decision.action == "open":
            self._open(spec, params, target, key, result, decision, now, silences, report)
            return
        assert row is not None
        change = self._expected(target.info, now)
        marked = False  # kvscope's own change began while the alert was open: mark it expected now
        if change is not None and not (row["labels"] or {}).get("expected"):
            row = {**row, "labels": {**(row["labels"] or {}), "expected": change.label}}
            marked = True
        self._apply(row, decision, result, now, silences, report, marked=marked)

    @staticmethod
    def _expected(info: Mapping[str, Any], now: float) -> expected.ExpectedWindow | None:
        return expected.covering(expected.from_info(info), now)

    def _backdate(self, spec: RuleSpec, params: dict[str, Any], data: TargetData, now: float) -> float:
        """Earliest scrape instant since the previous evaluation from which the rule held."""
        series = [s for name in spec.metrics[:2] for s in data.series.get(name)]
        if not series:
            return now
        gap = median_gap(series) or self.config.interval_s
        times = sample_times(series, now - self.config.interval_s - 2 * gap, now)
        since = now
        for t in reversed(times):
            if t >= now:
                continue
            try:
                held = spec.func(data, t, params).active is True
            except Exception:
                held = False
            if not held:
                break
            since = t
        return since

    # ------------------------------------------------------------------ writes
    def _deliveries(
        self, alert: Mapping[str, Any], event: str, silences: Sequence[Mapping[str, Any]], now: float
    ) -> list[store.NewDelivery]:
        if is_silenced(silences, str(alert["rule"]), alert.get("instance_id"), alert.get("host_id"), now):
            return []
        snap = snapshot(alert, event, base_url=self.config.base_url)
        return [
            store.NewDelivery(c.name, event, snap)
            for c in self.channels
            if c.wants(str(alert["rule"]), str(alert.get("severity", "warning")))
        ]

    def _refreshes(
        self, alert: Mapping[str, Any], silences: Sequence[Mapping[str, Any]], now: float
    ) -> list[store.NewDelivery]:
        """Alertmanager expires an alert it is not told about again before endsAt: re-send firing
        alerts every resend_s (not while an earlier one waits, not when silenced)."""
        if is_silenced(silences, str(alert["rule"]), alert.get("instance_id"), alert.get("host_id"), now):
            return []
        out = []
        for c in self.channels:
            state = self._refresh_state.get(c.name)
            if state is None or not c.wants(str(alert["rule"]), str(alert.get("severity", "warning"))):
                continue
            last, waiting = state
            aid = int(alert["id"])
            if aid in waiting or now - last.get(aid, float("-inf")) < self.config.resend_s:
                continue
            out.append(store.NewDelivery(c.name, "refresh", snapshot(alert, "refresh", base_url=self.config.base_url)))
        return out

    def _open(
        self,
        spec: RuleSpec,
        params: dict[str, Any],
        target: Target,
        key: str,
        result: RuleResult,
        decision: Decision,
        now: float,
        silences: Sequence[Mapping[str, Any]],
        report: EvalReport,
    ) -> None:
        at = float(decision.at if decision.at is not None else now)
        firing = decision.to_state == FIRING
        info = target.info
        values: dict[str, Any] = {
            "key": key,
            "rule": spec.name,
            "host_id": target.host_id,
            "instance_id": target.id if target.scope == "instance" else None,
            "state": FIRING if firing else PENDING,
            "severity": str(params.get("severity", "warning")),
            "opened_at": at,
            "since": now if firing else at,
            "fired_at": now if firing else None,
            "resolved_at": None,
            "last_eval": now,
            "value": result.value,
            "baseline": result.baseline,
            "message": result.message,
            "hints": [h.to_dict() for h in result.hints],
            "labels": {"rule": spec.name, "host": info.get("host"), "instance": info.get("url")},
            "acked_at": None,
            "ack_note": None,
        }
        change = self._expected(target.info, now)
        if change is not None:  # kvscope is changing this instance: expected, no notification
            values["labels"]["expected"] = change.label
        transitions = [store.TransitionRow(None, PENDING, at, result.value, result.message)]
        deliveries: list[store.NewDelivery] = []
        if firing and change is None:
            transitions.append(store.TransitionRow(PENDING, FIRING, now, result.value, result.message))
            snap_src = {
                **values,
                "instance_url": info.get("url"),
                "model": info.get("model"),
                "simulated": info.get("simulated"),
                "host": info.get("host"),
            }
            deliveries = self._deliveries(snap_src, "firing", silences, now)
        alert_id = store.open_alert(self.engine, values, transitions, deliveries, now)
        if alert_id is None:
            report.lost_races += 1
            return
        report.opened += 1
        if firing:
            report.fired += 1

    def _apply(
        self,
        row: AlertRow,
        decision: Decision,
        result: RuleResult,
        now: float,
        silences: Sequence[Mapping[str, Any]],
        report: EvalReport,
        *,
        marked: bool = False,
    ) -> None:
        """Write a decision on an open alert. `marked`: its labels were just marked expected (saved
        when it fires)."""
        values: dict[str, Any] = {}
        transitions: list[store.TransitionRow] = []
        deliveries: list[store.NewDelivery] = []
        # quiet: opened, or fires now, while kvscope itself changes the instance (no notification)
        quiet = bool((row["labels"] or {}).get("expected")) and (not marked or decision.action == "fire")
        if marked and decision.action == "fire":
            values["labels"] = row["labels"]
        if result.active is not None:
            values.update(value=result.value, baseline=result.baseline, message=result.message, last_eval=now)
            if result.active:
                values["hints"] = [h.to_dict() for h in result.hints]
        if decision.action == "fire":
            values.update(state=FIRING, since=now, fired_at=now)
            transitions.append(store.TransitionRow(PENDING, FIRING, now, result.value, result.message))
            merged = {**row, **values}
            deliveries = [] if quiet else self._deliveries(merged, "firing", silences, now)
        elif decision.action == "resolve":
            values.update(state=RESOLVED, since=now, resolved_at=now, active_key=None)
            msg = decision.reason + (f": {result.message}" if result.message else "")
            transitions.append(store.TransitionRow(row["state"], RESOLVED, now, result.value, msg))
            if row["state"] == FIRING and not quiet:
                merged = {**row, **values}
                deliveries = self._deliveries(merged, "resolved", silences, now)
        elif row["state"] == FIRING and not quiet:
            deliveries = self._refreshes({**row, **values}, silences, now)
        if decision.action == "update" and not values and not deliveries:
            return
        ok = store.cas_update(self.engine, int(row["id"]), int(row["version"]), values, transitions, deliveries, now)
        if not ok:
            report.lost_races += 1
            return
        if decision.action == "fire":
            report.fired += 1
        elif decision.action == "resolve":
            report.resolved += 1
