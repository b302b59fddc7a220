"""The consensus filter's durable join state: every input event and every decision, in one SQLite file
per consumer group (:class:`JoinState`; the rule itself and the service are :mod:`prmloop.consumers.consensus`)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prmloop.store.events import Envelope, LabelsAccepted, LabelsRejected
from prmloop.store.events.codec import decode_event, encode_event

__all__ = ["STATE_SQL", "Decider", "JoinState"]


STATE_SQL = """
CREATE TABLE IF NOT EXISTS inputs (event_id TEXT PRIMARY KEY, solution_id TEXT NOT NULL,
    side TEXT NOT NULL, status TEXT NOT NULL, occurred_at REAL NOT NULL, received_at REAL NOT NULL, body TEXT);
CREATE INDEX IF NOT EXISTS inputs_by_solution ON inputs (solution_id, status);
CREATE INDEX IF NOT EXISTS inputs_by_status ON inputs (status, solution_id);
CREATE TABLE IF NOT EXISTS decisions (solution_id TEXT PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,
    event_type TEXT NOT NULL, body TEXT NOT NULL, decided_at REAL NOT NULL, published INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS decisions_unpublished ON decisions (published, decided_at);
"""

#: (the waiting events: MC first, then the judge; the event that completed them) -> the decision.
Decider = Callable[[Sequence[Envelope], Envelope], Envelope]


class JoinState:
    """The join's durable state in one SQLite file (WAL, ``synchronous=FULL``).

    ``inputs``: every event seen, by id; ``side`` mc/judge; ``status`` pending (its ``body`` kept while
    it waits), used, superseded (a newer one of its side was weighed) or late (came after the decision).
    ``decisions``: one per solution, with its event and whether the broker acknowledged it. Every change
    is one ``BEGIN IMMEDIATE`` transaction: a SIGKILL keeps all of it or none; processes may share it.
    """

    def __init__(self, path: Path, *, lock_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = sqlite3.connect(str(path), timeout=lock_timeout_s, isolation_level=None, check_same_thread=False)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()
        with self._transaction() as con:
            for statement in filter(str.strip, STATE_SQL.split(";")):
                con.execute(statement)
        #: Waiting counts from here at the earliest: a restart gives every waiting half a fresh ``max_wait``.
        self.opened_at = time.time()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._con.execute("BEGIN IMMEDIATE")
            try:
                yield self._con
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def ingest(self, inputs: Iterable[tuple[Envelope, str, str, bytes]], decide: Decider) -> dict[str, Any]:
        """Store ``(event, solution id, side, body)``s, record the decisions they complete; counts them."""
        out: dict[str, Any] = {"new": 0, "duplicates": 0, "late": 0, "decisions": []}
        now = time.time()
        with self._transaction() as con:
            for event, sid, side, body in inputs:
                eid = str(event.event_id)
                if con.execute("SELECT 1 FROM inputs WHERE event_id = ?", (eid,)).fetchone():
                    out["duplicates"] += 1
                    continue
                late = con.execute("SELECT 1 FROM decisions WHERE solution_id = ?", (sid,)).fetchone() is not None
                row = (eid, sid, side, "late" if late else "pending", event.occurred_at.timestamp(), now)
                con.execute("INSERT INTO inputs VALUES (?, ?, ?, ?, ?, ?, ?)", (*row, None if late else body.decode()))
                out["late" if late else "new"] += 1
                if not late and len(waiting := self._waiting(con, sid)) == 2:
                    out["decisions"].append(self._record(con, sid, decide(waiting, event), now))
        return out

    def expire(self, max_wait_s: float, decide: Decider, now: float | None = None) -> list[Envelope]:
        """Decide every solution whose waiting half has waited ``max_wait_s`` (see the module docstring)."""
        now = time.time() if now is None else now
        with self._transaction() as con:
            due = con.execute(
                "SELECT solution_id FROM inputs WHERE status = 'pending' GROUP BY solution_id "
                "HAVING max(min(received_at), ?) + ? <= ?",
                (self.opened_at, max_wait_s, now),
            ).fetchall()
            return [self._record(con, sid, decide(w, w[0]), now) for (sid,) in due if (w := self._waiting(con, sid))]

    @staticmethod
    def _waiting(con: sqlite3.Connection, sid: str) -> list[Envelope]:
        """The newest waiting event of each side (by ``occurred_at``, then arrival), MC first."""
        rows = con.execute(
            "SELECT side, body FROM inputs WHERE solution_id = ? AND status = 'pending' ORDER BY occurred_at, rowid",
            (sid,),
        ).fetchall()
        newest = {side: body for side, body in rows}
        return [decode_event(newest[side]) for side in ("mc", "judge") if side in newest]

    @staticmethod
    def _record(con: sqlite3.Connection, sid: str, decision: Envelope, now: float) -> Envelope:
        payload = decision.payload
        assert isinstance(payload, LabelsAccepted | LabelsRejected)
        body = encode_event(decision).decode()
        con.execute(
            "INSERT INTO decisions VALUES (?, ?, ?, ?, ?, 0)",
            (sid, str(decision.event_id), decision.event_type, body, now),
        )
        used = [str(i) for i in payload.source_event_ids]
        con.execute(
            f"UPDATE inputs SET status = CASE WHEN event_id IN ({', '.join('?' * len(used))}) THEN 'used' "
            "ELSE 'superseded' END, body = NULL WHERE solution_id = ? AND status = 'pending'",
            (*used, sid),
        )
        return decision

    def unpublished(self, limit: int = 1000) -> list[Envelope]:
        with self._lock:
            sql = "SELECT body FROM decisions WHERE published = 0 ORDER BY decided_at, rowid LIMIT ?"
            return [decode_event(body) for (body,) in self._con.execute(sql, (limit,)).fetchall()]

    def mark_published(self, events: Sequence[Envelope]) -> None:
        with self._transaction() as con:
            ids = [(str(e.event_id),) for e in events]
            con.executemany("UPDATE decisions SET published = 1 WHERE event_id = ?", ids)

    def totals(self) -> dict[str, int]:
        """Solutions ``waiting`` for their partner; decisions this state file ever recorded."""
        with self._lock:
            sql = "SELECT count(DISTINCT solution_id) FROM inputs WHERE status = 'pending'"
            waiting = int(self._con.execute(sql).fetchone()[0])
            by_type = dict(self._con.execute("SELECT event_type, count(*) FROM decisions GROUP BY 1").fetchall())
        accepted, rejected = (int(by_type.get(t, 0)) for t in ("LabelsAccepted", "LabelsRejected"))
        return {"waiting": waiting, "accepted_total": accepted, "rejected_total": rejected}
