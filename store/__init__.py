"""The truth about data: event envelope and payloads, topics, Kafka plumbing, the embedded broker,
the DuckDB schema, the idempotent sink writer, projections and read-only SQL."""
