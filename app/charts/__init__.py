"""Plotly figure builders: Panels (app.derived) in, Plotly figure JSON (plain dicts) out."""
