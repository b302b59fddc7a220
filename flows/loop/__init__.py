"""The streaming loop: its settings, the driver that keeps the engine fed and retrains as labels arrive,
what it watches and reports, and the terminal session around it (``prmloop run``)."""
