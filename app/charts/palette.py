"""Every colour the instance charts use, in one place, so one meaning has one colour and two
series drawn side by side never share one.

Token sources (GPU hit / offload reload / recompute) and hit rates take theirs from the KV
vocabulary (kvcore/kv_vocabulary.py), which the A/B charts share.
"""

from __future__ import annotations

from kvcore import kv_vocabulary as kv

# Tableau 10, by role
GREEN = "#2ca02c"
BLUE = "#1f77b4"
RED = "#d62728"
ORANGE = "#ff7f0e"
PURPLE = "#9467bd"
BROWN = "#8c564b"
PINK = "#e377c2"
GREY = "#7f7f7f"
OLIVE = "#bcbd22"
CYAN = "#17becf"

SOURCE_COLORS = {src.vllm_label: src.color for src in kv.SOURCES}  # defined in kvcore/kv_vocabulary.py
OTHER_SOURCE_COLORS = [PURPLE, CYAN, OLIVE, PINK, BROWN]  # sources vLLM adds later, in order

HIT_RATE = {d.key: d.color for d in kv.HIT_RATES}
TRANSFER = {"load": BLUE, "store": PURPLE}
CEILING = RED
PINNED = {
    "configured": GREY,
    "file": CYAN,
    "resident": BLUE,
    "rss_shmem": PURPLE,
    "limit": RED,
    "headroom": GREEN,
}
TIERS = {"gpu": GREEN, "cpu_pinned": BLUE, "cpu_fill": ORANGE}
# latency: TTFT quantiles warm to hot, ITL in cool dotted tones, load and preemptions apart
TTFT = {0.5: GREEN, 0.95: ORANGE, 0.99: RED}
ITL = {0.5: CYAN, 0.95: PINK}
LOAD = {"running": BLUE, "waiting": PURPLE, "preemptions": BROWN}
# per-GPU panels: one colour per GPU (memory used solid, total dashed, both in the GPU's colour)
GPU_CYCLE = [BLUE, ORANGE, GREEN, PURPLE, BROWN, PINK, OLIVE, CYAN]

EVENTS = {
    "restart": RED,
    "config_change": ORANGE,
    "counter_reset": BROWN,
    "rollout": PURPLE,
    "counter_clamped": OLIVE,
    "experiment": PINK,
}


def gpu_color(index: int) -> str:
    return GPU_CYCLE[index % len(GPU_CYCLE)]
