"""The Kafka room: the event producer and topic admin (:mod:`.producer`), the consumer runtime every
service runs on (:mod:`.runtime`, :mod:`.service`), following the broker across restarts, the outbox,
dead letters, poison records, stalls and lag, and reconciliation with the store."""
