"""Readers read the snapshot the writer publishes, never its file (issue 54, point 2).

A reader used to open the DuckDB file itself, and DuckDB's lock let it hold the sink off for as long as
it read. These tests hold a reader open while the writer writes, read from another process right after
a write (read-your-writes), and read after the writer died without publishing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore, open_reader, query
from prmloop.store.tables.published import current_snapshot, snapshot_files


def _write(store: DuckEventStore, n: int, seed: int, offset: int = 0) -> None:
    events = synthetic_events(n, k=4, seed=seed)
    rows = events_to_arrow([ConsumedEvent(e, "t", 0, offset + i, 0) for i, e in enumerate(events)])
    store.write_batch(rows, [("t", 0, offset + n)])


def test_an_open_reader_does_not_hold_the_writer_off(tmp_path: Path) -> None:
    db = tmp_path / "prmloop.duckdb"
    store = DuckEventStore(db, lock_timeout_s=3.0)  # the old reader held the file: StoreLocked after 3 s
    _write(store, 50, seed=1)
    with open_reader(db) as (con, _):
        before = con.execute("SELECT count(*) FROM events").fetchone()
        _write(store, 50, seed=2, offset=50)  # while the reader is open
        _write(store, 50, seed=3, offset=100)
        assert con.execute("SELECT count(*) FROM events").fetchone() == before  # its snapshot stays as it was
    assert query(db, "SELECT count(*) FROM events").rows == [(150,)]  # a new read sees every batch
    assert len(snapshot_files(db)) == 1  # older copies are gone once no reader has them
    store.close()


def test_a_read_from_another_process_sees_every_batch_stored_before_it(tmp_path: Path) -> None:
    db = tmp_path / "prmloop.duckdb"
    store = DuckEventStore(db, publish_every_s=30.0)  # the next publication would come only in 30 s
    _write(store, 20, seed=4)
    _write(store, 20, seed=5, offset=20)  # not published yet: the interval has not passed
    code = (
        "import sys; from prmloop.store.tables.duck import query; "
        "print(query(sys.argv[1], 'SELECT count(*) FROM events', timeout_s=60).rows[0][0])"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "40", done.stdout + done.stderr
    # The writer was alive and late (its interval 30 s): the reader copied the file itself after its grace.
    assert time.monotonic() - started < 60
    store.close()


def test_a_writer_killed_before_it_published_leaves_nothing_unread(tmp_path: Path) -> None:
    db = tmp_path / "prmloop.duckdb"
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from prmloop.consumers.sink import events_to_arrow\n"
        "from prmloop.flows.lab.bench.synthetic import synthetic_events\n"
        "from prmloop.store.kafka.runtime import ConsumedEvent\n"
        "from prmloop.store.tables.duck import DuckEventStore\n"
        "store = DuckEventStore(Path(sys.argv[1]), publish_every_s=600)\n"
        "events = synthetic_events(30, k=4, seed=6)\n"
        "store.write_batch(events_to_arrow([ConsumedEvent(e, 't', 0, i, 0) for i, e in enumerate(events)]), "
        "[('t', 0, 30)])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    found = current_snapshot(db)
    assert found is not None  # the copy published at its start, before the batch
    assert query(db, "SELECT count(*) FROM events").rows == [(30,)]  # no writer lives: the reader copied it
    copied = current_snapshot(db)
    assert copied is not None and os.stat(copied[0]).st_mode & 0o077 == 0  # private, as the store is
