"""Benchmarks run as `rollstream bench NAME`; each prints one JSON object as its last line."""
