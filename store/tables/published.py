"""Read snapshots of the DuckDB file: what readers open, so that no reader ever holds the sink up.

DuckDB lets no writer in while any process has the file open, even read-only, so a reader that runs
for minutes (a user's query, an export, the retrain's snapshot) used to stop ingestion for as long
(issue 54: 100 events published during a query, none stored until it was killed). Now readers never
open the writer's file. The writer publishes a copy of it: after a batch, once its connection is
closed (the file checkpointed, whole), it copies the file under DuckDB's shared lock to a temporary
name and renames it to ``<file>.snapshot-<generation>``, then points ``<file>.snapshot.json`` at it
and unlinks the previous copy (a reader that still has it open keeps reading it: the kernel frees it
when the last one closes). Readers open the newest copy, read-only; the writer never waits for them.

Freshness, read-your-writes included: the writer counts its commits in ``<file>.writer`` (a
generation, the time in nanoseconds, written after each batch) and holds an exclusive ``flock`` on
that file while it lives. A reader notes the generation and the file's modification time when it
starts and opens a copy at least that new: at once when there is one, else it waits for the writer
to publish (a writer in the same process publishes at once when asked), or, when no writer lives (the
lock is free: none runs, or it was killed) or it has not published within a grace period, it publishes
the copy itself. So everything stored before a read starts is in what it reads, as before.

Cost: a copy of the whole file per publication (the kernel's ``copy_file_range``, a reflink where the
file system has them), at most once per ``publish_every_s`` and never more than a fifth of the
writer's time (the interval grows to four times the last copy's duration), and a second copy's room on
disk (more while long readers keep older ones open). ``prmloop bench stalls`` measures it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import json
import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb

__all__ = [
    "FICLONE",
    "Freshness",
    "PublishStats",
    "Publisher",
    "StoreLocked",
    "WriterMark",
    "copy_file",
    "current_snapshot",
    "publish",
    "reading_copy",
    "snapshot_files",
]

log = logging.getLogger(__name__)

FICLONE = 0x40049409
#: A reader waits this long for a live writer's publication before it publishes the copy itself.
GRACE_S = 5.0
_GEN = struct.Struct("=q")
_FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, length, pid (0 for an OFD lock)


class StoreLocked(TimeoutError):
    """The store stayed locked, or no read snapshot came, for longer than a reader waits."""


def _meta_path(db: Path) -> Path:
    return db.with_name(db.name + ".snapshot.json")


def _writer_path(db: Path) -> Path:
    return db.with_name(db.name + ".writer")


def _lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".publish.lock")


def snapshot_files(db: Path) -> list[Path]:
    """Every read snapshot of ``db`` on disk (the current one, and any a crash left behind)."""
    return sorted(db.parent.glob(db.name + ".snapshot-*"))


@dataclass(frozen=True)
class Freshness:
    """How new a copy must be: the writer's generation and the file's identity and time when a read starts."""

    generation: int
    inode: int
    mtime_ns: int

    @classmethod
    def now(cls, db: Path) -> Freshness:
        st = db.stat()
        return cls(_read_generation(db), st.st_ino, st.st_mtime_ns)

    def met_by(self, meta: dict[str, Any] | None) -> bool:
        return (
            meta is not None
            and meta.get("inode") == self.inode
            and int(meta.get("generation", -1)) >= self.generation
            and int(meta.get("mtime_ns", -1)) >= self.mtime_ns
        )


def _read_generation(db: Path) -> int:
    try:
        with open(_writer_path(db), "rb") as f:
            data = f.read(_GEN.size)
    except FileNotFoundError:
        return 0
    return int(_GEN.unpack(data)[0]) if len(data) == _GEN.size else 0


def current_snapshot(db: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest published copy of ``db`` and what it was copied from, or None."""
    try:
        meta = json.loads(_meta_path(db).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or "/" in meta["name"]:
        return None
    return db.with_name(meta["name"]), meta


def writer_alive(db: Path) -> bool:
    """A writer holds ``<db>.writer``'s lock (a process that died holds nothing)."""
    try:
        fd = os.open(_writer_path(db), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class WriterMark:
    """The writer's side: its generation counter and the lock that says it lives."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self._fd = os.open(_writer_path(db), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.holds_lock = True
        except BlockingIOError:  # another writer object (this process's or a second sink's) holds it
            self.holds_lock = False
        self.generation = _read_generation(db)

    def committed(self) -> int:
        """A batch was committed: a new generation, written where readers look."""
        self.generation = max(self.generation + 1, time.time_ns())
        os.pwrite(self._fd, _GEN.pack(self.generation), 0)
        return self.generation

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def copy_file(src: int, dst: int) -> None:
    """Copy the whole of file ``src`` into the empty ``dst``: a reflink where the file system can, else
    the kernel's in-place copy, else read and write."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return
    except OSError:
        pass
    size = os.fstat(src).st_size
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(src, dst, size - copied, copied, copied)
            if n == 0:
                break
            copied += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.lseek(src, 0, os.SEEK_SET)
        os.lseek(dst, 0, os.SEEK_SET)
        os.ftruncate(dst, 0)
        while chunk := os.read(src, 1 << 20):
            os.write(dst, chunk)


@dataclass
class PublishStats:
    publications: int = 0
    last_copy_s: float = 0.0
    last_bytes: int = 0
    copy_s_total: float = 0.0


class _Connect(Protocol):
    def __call__(self, path: Path, *, timeout_s: float) -> tuple[duckdb.DuckDBPyConnection, float]: ...


@contextlib.contextmanager
def _writers_held_off(db: Path, connect: _Connect, timeout_s: float) -> Iterator[None]:
    """No writer in ``db`` while this lasts: an open-file-description read lock on the whole file,
    the lock DuckDB's own readers and writers take (``fcntl``), retried while a writer holds it; where
    the kernel has no such locks, a read-only DuckDB connection (slower: it reads the catalog)."""
    ofd = getattr(fcntl, "F_OFD_SETLK", None)
    if ofd is None:
        con, _ = connect(db, timeout_s=timeout_s)
        try:
            yield
        finally:
            con.close()
        return
    fd = os.open(db, os.O_RDONLY | os.O_CLOEXEC)
    try:
        start, delay = time.monotonic(), 0.002
        while True:
            try:
                fcntl.fcntl(fd, ofd, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                waited = time.monotonic() - start
                if waited >= timeout_s:
                    raise StoreLocked(
                        f"{db} stayed locked by another writer for {waited:.1f}s; retry, or check that only one "
                        "`prmloop sink` runs"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        yield
    finally:
        os.close(fd)  # the lock goes with its file description


def publish(
    db: Path, generation: int, *, connect: _Connect, timeout_s: float, stats: PublishStats | None = None
) -> dict[str, Any]:
    """Copy ``db`` as it is now to a new read snapshot and make it the current one; its record.

    The copy is taken with every writer held off (:func:`_writers_held_off`), so no batch is half in
    it, and with the write-ahead log a killed writer left, if any; publications are one at a time."""
    lock = os.open(_lock_path(db), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _writers_held_off(db, connect, timeout_s):
            t0 = time.monotonic()
            st = db.stat()
            name = f"{db.name}.snapshot-{max(generation, 0)}-{st.st_mtime_ns}"
            tmp = db.with_name(db.name + ".snapshot.tmp")
            wal = db.with_name(db.name + ".wal")
            for path, into in ((db, tmp), (wal, tmp.with_name(tmp.name + ".wal"))):
                with contextlib.suppress(FileNotFoundError):
                    into.unlink()
                try:
                    src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # no write-ahead log: the usual case, the writer checkpointed at its close
                try:
                    dst = os.open(into, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                    try:
                        copy_file(src, dst)
                    finally:
                        os.close(dst)
                finally:
                    os.close(src)
        target = db.with_name(name)
        if tmp.with_name(tmp.name + ".wal").exists():
            os.replace(tmp.with_name(tmp.name + ".wal"), target.with_name(target.name + ".wal"))
        os.replace(tmp, target)
        took = time.monotonic() - t0
        meta = {
            "name": name,
            "generation": generation,
            "inode": st.st_ino,
            "mtime_ns": st.st_mtime_ns,
            "bytes": st.st_size,
            "copy_s": round(took, 4),
        }
        meta_tmp = db.with_name(db.name + ".snapshot.json.tmp")
        fd = os.open(meta_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        os.replace(meta_tmp, _meta_path(db))
        for old in snapshot_files(db):
            if old.name not in (name, name + ".wal"):
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()
        if stats is not None:
            stats.publications += 1
            stats.last_copy_s = took
            stats.copy_s_total += took
            stats.last_bytes = st.st_size
        return meta
    finally:
        os.close(lock)


class PublishingWriter(Protocol):
    def publish_if_due(self, *, timeout_s: float) -> bool: ...


#: This process's writers, by file: a reader here asks its writer to publish at once.
_WRITERS: weakref.WeakValueDictionary[Path, Any] = weakref.WeakValueDictionary()


def register_writer(db: Path, writer: PublishingWriter) -> None:
    _WRITERS[db.resolve()] = writer


def unregister_writer(db: Path, writer: PublishingWriter) -> None:
    key = db.resolve()
    if _WRITERS.get(key) is writer:
        del _WRITERS[key]


def reading_copy(db: Path, *, connect: _Connect, timeout_s: float, fresh: bool = True) -> tuple[Path | None, float]:
    """The read snapshot a reader of ``db`` opens now: one holding everything stored before this call
    (published here if need be); its seconds waited. ``fresh=False``: the newest published one as it
    is, without waiting (a monitor polling the store; what was stored since the last publication,
    at most ``publish_every_s`` ago while a writer runs, is missing). None when no copy can be made
    beside ``db`` (a folder this user may not write): the reader opens ``db`` itself, as before."""
    start = time.monotonic()
    want = Freshness.now(db)
    delay = 0.005
    while True:
        found = current_snapshot(db)
        usable = found is not None and (want.met_by(found[1]) or (not fresh and found[1].get("inode") == want.inode))
        if found is not None and usable and found[0].exists():
            return found[0], time.monotonic() - start
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise StoreLocked(
                f"{db}: no read snapshot as new as this read came within {waited:.1f}s; retry, or check that "
                "only one `prmloop sink` runs"
            )
        remaining = max(timeout_s - waited, 0.05)
        own = _WRITERS.get(db.resolve())
        # A live writer publishes by itself; a reader copies the file only when none lives, or when it
        # is late (a copy takes the writer's lock from it while it lasts).
        grace = GRACE_S + 4 * float(found[1].get("copy_s", 0.0)) if found is not None else GRACE_S
        try:
            if own is not None:
                if own.publish_if_due(timeout_s=remaining):
                    continue
            elif not writer_alive(db) or waited >= min(grace, timeout_s):
                publish(db, _read_generation(db), connect=connect, timeout_s=remaining)
                continue
        except PermissionError:
            return None, waited
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES):
                return None, waited
            raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class Publisher:
    """When a writer publishes: at once after a batch if the last publication is old enough, else
    once it is (a thread of this process, one for all writers). ``publish_every_s`` at least apart, and
    four times the last copy's duration: copies take at most a fifth of the writer's time."""

    def __init__(self, run: Callable[[], None], publish_every_s: float, stats: PublishStats) -> None:
        self._run = run
        self.publish_every_s = publish_every_s
        self.stats = stats
        self.last_end = float("-inf")
        self.dirty = False

    def due_at(self) -> float:
        return self.last_end + max(self.publish_every_s, 4 * self.stats.last_copy_s)

    def changed(self) -> None:
        """A batch was stored: publish now, or schedule it."""
        self.dirty = True
        if time.monotonic() >= self.due_at():
            try:
                self._run()
            except Exception as exc:  # noqa: BLE001 - the batch is stored: a publication is tried again later
                log.warning("publishing a read snapshot failed (tried again; readers publish their own): %s", exc)
                self.last_end = time.monotonic()
                _scheduler().at(self.due_at(), self)
        else:
            _scheduler().at(self.due_at(), self)

    def ran(self) -> None:
        self.dirty = False
        self.last_end = time.monotonic()


class _Scheduler:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, weakref.ref[Publisher]]] = []
        self._seq = 0
        threading.Thread(target=self._loop, name="prmloop-snapshot-publisher", daemon=True).start()

    def at(self, when: float, publisher: Publisher) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (when, self._seq, weakref.ref(publisher)))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else max(self._heap[0][0] - time.monotonic(), 0))
                _, _, ref = heapq.heappop(self._heap)
            publisher = ref()
            if publisher is None or not publisher.dirty:
                continue
            if time.monotonic() < publisher.due_at():
                self.at(publisher.due_at(), publisher)
                continue
            try:
                publisher._run()
            except Exception as exc:  # noqa: BLE001 - tried again; a reader publishes what it misses
                log.warning("publishing a read snapshot failed (tried again; readers publish their own): %s", exc)
                publisher.last_end = time.monotonic()
                self.at(publisher.due_at(), publisher)


_SCHEDULERS: dict[int, _Scheduler] = {}  # by process id: a forked child has none of its parent's threads
_SCHEDULER_LOCK = threading.Lock()


def _scheduler() -> _Scheduler:
    with _SCHEDULER_LOCK:
        pid = os.getpid()
        if pid not in _SCHEDULERS:
            _SCHEDULERS.clear()
            _SCHEDULERS[pid] = _Scheduler()
        return _SCHEDULERS[pid]
