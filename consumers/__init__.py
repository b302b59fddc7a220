"""Long-running services that read a topic and emit events or effects: step uncertainty, MC-PPL
annotation, judge, consensus, and the DuckDB sink (the only writer)."""
