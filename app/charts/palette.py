"""Every colour the charts use, by role, so one meaning has one colour and two series drawn side
by side never share one.

The colours themselves (Tableau 10) are defined once, in the KV vocabulary (kvcore/kv_vocabulary.py),
with the token sources' and hit rates' own; the instance, overview and A/B charts all take theirs here.
"""

from __future__ import annotations

from kvcore import kv_vocabulary as kv

GREEN, BLUE, RED, ORANGE, PURPLE = kv.GREEN, kv.BLUE, kv.RED, kv.ORANGE, kv.PURPLE
BROWN, PINK, GREY, OLIVE, CYAN = kv.BROWN, kv.PINK, kv.GREY, kv.OLIVE, kv.CYAN

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


EVENT_OTHER = GREY
ARMS = {"A": BLUE, "B": ORANGE}  # the two arms of an A/B experiment
SPARK = {"hit": GREEN, "ttft95": ORANGE}  # the overview's sparklines


def gpu_color(index: int) -> str:
    return GPU_CYCLE[index % len(GPU_CYCLE)]
