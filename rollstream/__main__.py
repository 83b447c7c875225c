"""`python -m rollstream` runs the CLI (the pipeline supervisor starts children this way)."""

from rollstream.cli import app

app()
