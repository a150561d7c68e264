"""JSON API under /api/v1 (and /healthz)."""
