"""The tables room: the event stores (DuckDB file, DuckLake) behind one :class:`~.writer.EventStore`
protocol, their projections, the SQL guard, exports, snapshots, the model registry, the question queue
and the metrics read from them."""
