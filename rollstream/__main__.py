"""`python -m rollstream` runs the CLI (the pipeline supervisor starts children this way; torchrun
starts the trainer's ranks this way, each first tied to torchrun's life)."""

from trainer.torchrun import die_with_torchrun

die_with_torchrun()

from rollstream.cli import app  # noqa: E402 (after: a rank orphaned while importing must not run)

app()
