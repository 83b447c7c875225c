"""Local services for development, tests and CI: the Kafka broker (single node or a
three-node KRaft cluster) and a PostgreSQL server, all state under `<state_dir>/`.

`kafka.ensure_up`/`postgres.ensure_up` are idempotent and safe to call from many
processes at once (a file lock serialises starting); the services run in their own
session so they outlive the shell that started them.
"""
