"""A/B experiments of serving profiles: orchestration, statistics, verdict, export.

An experiment switches one instance between profile A and profile B through the controller's
rollouts, runs the same workload in interleaved runs (A B A B ...), brackets every run by counter
snapshots, and compares the arms with bootstrap confidence intervals (app.ab.stats).
"""
