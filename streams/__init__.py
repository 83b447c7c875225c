"""Streams: the event contract, topics, the Kafka bus, stream processors, policies, the SQL store, replay."""
