"""The SQL event store: every event the sink has read, its projections, the sink's offsets.

`open_store(url) -> Engine` (migrations applied) is the entry point; `write_batch`
stores a batch and its offsets in one transaction; `rows` holds the pure
event-to-row functions. SQLite (default, `<state_dir>/events.db`) and PostgreSQL.
"""

from streams.store.migrate import StoreError, open_readonly, open_store
from streams.store.rows import StoredEvent, event_from_row, event_row, projection_rows
from streams.store.writer import load_offsets, write_batch

__all__ = [
    "StoreError",
    "StoredEvent",
    "event_from_row",
    "event_row",
    "load_offsets",
    "open_readonly",
    "open_store",
    "projection_rows",
    "write_batch",
]
