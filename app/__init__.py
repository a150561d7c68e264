"""kvscope app: the central service (storage, derived series, pages, alerts, controller, A/B)."""
