"""Alerts: pure rules over stored series, cause hints, evaluation with a stored state
machine (pending -> firing -> resolved, compare-and-set), notification channels with retries.

Layout:
- series.py     window arithmetic over raw points (reset-corrected increases, gauges, quantiles)
- hitrates.py   vLLM's hit-rate definitions (overall, GPU, offload tier)
- hints.py      likely causes attached to a hit-rate alert
- rules*.py     the rules, pure functions of (data, now, params)
- catalog.py    the rule registry: names, defaults, scopes
- params.py     defaults <- settings <- per-instance overrides
- state.py      the pure state machine
- inputs.py     loads series for a target from storage (cached, incremental)
- evaluate.py   the evaluation job
- channels.py / delivery.py   notification payloads and the delivery job
"""
