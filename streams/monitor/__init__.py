"""The monitor: a faust-streaming app folding the derived topics into Prometheus figures."""
