"""The aiokafka internals Rollstream relies on, in one module.

Checked against aiokafka 0.14.0; `pyproject.toml` pins `aiokafka>=0.14,<0.15` so an
upgrade past that range is a deliberate step: re-check each item below (the bus and
stream-worker tests in tests/log and tests/streams exercise all of them) and widen the pin.

- `refresh_metadata(consumer)`: `AIOKafkaConsumer._client.force_metadata_update()`. A
  consumer that has subscribed to nothing knows no topic, and `partitions_for_topic`
  only reads its metadata cache; the public API has no call that refreshes it.
- `BatchBuilder`: the type `AIOKafkaProducer.create_batch()` returns (that method and
  `send_batch` are public; the class is only importable from
  `aiokafka.producer.message_accumulator`).
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.producer.message_accumulator import BatchBuilder

__all__ = ["BatchBuilder", "refresh_metadata"]


async def refresh_metadata(consumer: AIOKafkaConsumer) -> None:
    """Fetch cluster metadata now, so `consumer.partitions_for_topic` knows topics created since."""
    await consumer._client.force_metadata_update()
