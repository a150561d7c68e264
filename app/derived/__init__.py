"""Derived series: what the charts plot, computed from stored counters and gauges.

grid.py (evaluation instants), evaluate.py (rates, gauges, ratios, histogram quantiles on any
tier), pcie.py (link ceilings), panels.py (the data of each instance chart), worth.py (the
"is offload worth it?" figures), overview.py (states and sparklines of the overview page).
"""
