"""``prmloop demo``: the streaming loop, time-boxed, on the embedded defaults."""
