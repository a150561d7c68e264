"""Derived series: what the charts plot, computed from stored counters and gauges.

series_reader.py (the one read of a series' points, tier chosen there; series_types.py its
result), grid.py (evaluation instants), grid_math.py (rates, gauges, ratios, histogram quantiles
on any tier), live.py (the live-range memo), pcie.py (link ceilings), panels.py (the data of each
instance chart), worth.py (the "is offload worth it?" figures), fleet.py (states and sparklines of
the overview page).
"""
