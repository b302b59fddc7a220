"""A lake writer whose PostgreSQL catalog dies in the middle of a batch keeps working once it is back.

Real components: PostgreSQL (pgserver's binaries, run by ``serve_postgres`` in a process group of its
own, SIGKILLed as the chaos test kills it), DuckDB with DuckLake, the sink's batch handler. PostgreSQL
is frozen (SIGSTOP) at the moment the batch asks for its staging SQL, so the batch waits inside its
transaction (its rows registered on the connection) when the kill lands, every time.

What went wrong before (found by killing PostgreSQL under a writer 25 times in a row): a failed batch
left its views registered on the connection when its clean-up failed, and every later batch failed
with "View with name incoming already exists" for good; and closing a connection whose database a
fatal error had invalidated aborted the whole process (store/tables/lake.py: ``release``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prmloop.consumers.sink import Sink
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.postgres import postgres_bin_dir, wait_ready
from prmloop.store.auth.credentials import SINK_ROLE, load_credentials
from prmloop.store.kafka.poison import is_transient
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.ports import free_port
from prmloop.store.tables import lake
from prmloop.store.tables.duck import open_writer, query
from prmloop.store.tables.lake import LakeEventStore, LakeStore


class Catalog:
    """A PostgreSQL of the test's own, killed and started again on the same folder and port."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        code = (
            "from pathlib import Path; from prmloop.flows.ops.postgres import serve_postgres; "
            f"serve_postgres(Path({str(self.folder / 'pg')!r}), {self.port}, ['lake'], "
            f"log=Path({str(self.folder / 'postgres.log')!r}))"
        )
        with (self.folder / "serve.log").open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code], start_new_session=True, stdout=log, stderr=log
            )
        wait_ready("127.0.0.1", self.port, 60)
        # serve_postgres creates the database right after the server answers: wait for it too.
        deadline = time.monotonic() + 30
        while self.psql("SELECT 1").returncode != 0:
            assert time.monotonic() < deadline, "the database lake was not created"
            time.sleep(0.2)

    def signal(self, signum: int) -> list[int]:
        """``signum`` to every process of the server (its backends are sessions of their own); their pids."""
        assert self.process is not None
        pids = _tree(self.process.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return pids

    def kill(self) -> None:
        self.gone(self.signal(signal.SIGKILL))

    def gone(self, pids: list[int]) -> None:
        """Wait for ``pids`` to be reaped: a new postmaster refuses to start while the old one's pid lives."""
        assert self.process is not None
        self.process.wait()
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in pids):
            assert time.monotonic() < deadline, "the killed PostgreSQL's processes are still there"
            time.sleep(0.1)

    def psql(self, sql: str) -> subprocess.CompletedProcess[str]:
        """``sql`` in the lake's database as its owner, the sinks' role (its password from its passfile)."""
        args = [str(postgres_bin_dir() / "psql"), "-X", "-q", "-w", "-h", "127.0.0.1", "-p", str(self.port)]
        args += ["-U", SINK_ROLE, "-d", "lake", "-c", sql]
        env = {**os.environ, "PGPASSFILE": str(load_credentials().passfile(SINK_ROLE))}
        return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, check=False)


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    catalog = Catalog(tmp_path)
    catalog.start()
    try:
        yield catalog
    finally:
        if catalog.process is not None and catalog.process.poll() is None:
            catalog.kill()


def batch(start: int, n: int = 40) -> list[ConsumedEvent]:
    return [ConsumedEvent(e, "t", 0, start + i, 0) for i, e in enumerate(synthetic_events(n, seed=start))]


def test_a_batch_cut_off_by_the_catalogs_death_is_stored_once_it_is_back(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_staging = lake.stage_sql
    passfile = load_credentials().passfile(SINK_ROLE)
    store = LakeStore(
        f"postgres:dbname=lake user={SINK_ROLE} passfile={passfile} host=127.0.0.1 port={catalog.port}",
        tmp_path / "data",
    )
    writer = open_writer(store)
    assert isinstance(writer, LakeEventStore)
    sink = Sink(writer)
    sink(batch(0))

    for round_ in range(2):  # a second death on the connection the first recovery attached
        start = 40 * (1 + 2 * round_)
        # PostgreSQL frozen once the batch's transaction has begun and its rows are registered on the
        # connection (the moment the sink asks for its staging SQL); killed 2 s later by another
        # process (the batch's wait for the catalog holds the GIL).
        frozen: list[int] = []

        def staging(rows: Any, frozen: list[int] = frozen) -> str:
            frozen.extend(catalog.signal(signal.SIGSTOP))
            subprocess.Popen(["sh", "-c", f"sleep 2; kill -KILL {' '.join(map(str, frozen))}"])
            return str(real_staging(rows))

        monkeypatch.setattr(lake, "stage_sql", staging)
        began = time.monotonic()
        try:
            sink(batch(start))
        except Exception as exc:  # noqa: BLE001 - what the batch met is the test's subject
            failed: BaseException | None = exc
        else:
            failed = None
        waited = time.monotonic() - began
        monkeypatch.setattr(lake, "stage_sql", real_staging)
        assert frozen, "the batch never staged its rows"
        catalog.gone(frozen)
        assert waited > 2, f"the batch did not wait for its frozen catalog ({waited:.1f} s)"
        assert failed is not None, "the batch claims to be stored although its catalog died before its commit"
        # What the consumer runtime retries; anything else it would dead-letter as a poison batch.
        assert is_transient(failed), f"a lost catalog looks like a poison batch: {failed!r}"

        for _attempt in range(3):  # the consumer runtime retries the batch while the catalog is down
            with pytest.raises(Exception) as down:
                sink(batch(start))
            assert is_transient(down.value), f"a catalog that is down looks like a poison batch: {down.value!r}"
        catalog.start()
        # As the chaos test: started again on the folder a killed server left. The consumer runtime
        # retries a failed batch: the same one, then the next.
        for _attempt in range(60):
            try:
                sink(batch(start))
                break
            except Exception as exc:  # noqa: BLE001 - PostgreSQL may still be recovering
                last = exc
                time.sleep(0.5)
        else:
            raise AssertionError(f"the batch cut off by the kill never got stored: {last}")
        sink(batch(start + 40))

    writer.close()
    stored = query(store, "SELECT count(*), count(DISTINCT event_id) FROM events", timeout_s=30).rows[0]
    assert stored == (200, 200)
