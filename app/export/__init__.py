"""Export: the app as a Prometheus exporter of derived series (/metrics), and a Prometheus as a
history source for the charts."""
