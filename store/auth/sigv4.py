"""AWS Signature Version 4, checked: what the object gateway asks of every request.

Tansu's S3 client (the ``object_store`` crate) signs each request with the access key it is given
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``): an ``Authorization: AWS4-HMAC-SHA256 Credential=<key
id>/<date>/<region>/s3/aws4_request, SignedHeaders=..., Signature=...`` header over the method, path,
query, the signed headers and the payload's SHA-256 (``x-amz-content-sha256``). :func:`check` rebuilds
that signature with the gateway's secret (the credentials file's) and says what is wrong, or None.
The algorithm is AWS's published one ("Signature Version 4 signing process"); a request older or
newer than 15 minutes is refused, so a captured one cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

__all__ = ["ALGORITHM", "UNSIGNED_PAYLOAD", "check", "sign_headers"]

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_SKEW = timedelta(minutes=15)
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/,\s]+)/(?P<service>[^/,\s]+)"
    r"/aws4_request,\s*SignedHeaders=(?P<headers>[^,\s]+),\s*Signature=(?P<signature>[0-9a-f]{64})\s*$"
)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def _canonical_query(raw: str) -> str:
    pairs = [
        (_quote(urllib.parse.unquote(k)), _quote(urllib.parse.unquote(v)))
        for k, _, v in (part.partition("=") for part in raw.split("&") if part)
    ]
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _signature(
    secret: str,
    method: str,
    *,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    signed: list[str],
    payload_hash: str,
    amz_date: str,
    scope: str,
) -> str:
    canonical_headers = "".join(f"{name}:{' '.join(headers.get(name, '').strip().split())}\n" for name in signed)
    request = "\n".join(
        [method, raw_path or "/", _canonical_query(raw_query), canonical_headers, ";".join(signed), payload_hash]
    )
    to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(request.encode()).hexdigest()])
    date, region, service, _ = scope.split("/")
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), date), region), service), "aws4_request")
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def check(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    access_key_id: str,
    secret: str,
    now: datetime | None = None,
) -> str | None:
    """None if the request (``headers`` with lower-case names, the path and query as sent) carries a valid
    signature by ``access_key_id``; otherwise what is wrong, in one line."""
    found = _AUTHORIZATION.match(headers.get("authorization", ""))
    if found is None:
        return "the request is not signed (AWS Signature Version 4 with the gateway's key)"
    if not hmac.compare_digest(found["key"], access_key_id):
        return "the request is signed with an unknown access key"
    signed = found["headers"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return "the signature must cover the host and x-amz-date headers"
    amz_date = headers.get("x-amz-date", "")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return f"the request's x-amz-date {amz_date!r} is not an AWS date"
    if abs((now or datetime.now(UTC)) - when) > MAX_SKEW or amz_date[:8] != found["date"]:
        return "the request's date is more than 15 minutes away from the gateway's clock"
    payload_hash = headers.get("x-amz-content-sha256", "")
    if payload_hash != UNSIGNED_PAYLOAD and payload_hash != hashlib.sha256(body).hexdigest():
        return "the request's body does not match its x-amz-content-sha256"
    scope = f"{found['date']}/{found['region']}/{found['service']}/aws4_request"
    expected = _signature(
        secret,
        method,
        raw_path=raw_path,
        raw_query=raw_query,
        headers=headers,
        signed=signed,
        payload_hash=payload_hash,
        amz_date=amz_date,
        scope=scope,
    )
    if not hmac.compare_digest(expected, found["signature"]):
        return "the request's signature does not match"
    return None


def sign_headers(
    method: str,
    url: str,
    body: bytes,
    *,
    access_key_id: str,
    secret: str,
    region: str = "us-east-1",
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers that sign a request to ``url`` (what an S3 client sends): for prmloop's own clients
    of the gateway and the tests."""
    parts = urllib.parse.urlsplit(url)
    moment = now or datetime.now(UTC)
    amz_date = moment.strftime("%Y%m%dT%H%M%SZ")
    headers = {"host": parts.netloc, "x-amz-date": amz_date, "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    signed = sorted(headers)
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    signature = _signature(
        secret,
        method,
        raw_path=parts.path,
        raw_query=parts.query,
        headers=headers,
        signed=signed,
        payload_hash=headers["x-amz-content-sha256"],
        amz_date=amz_date,
        scope=scope,
    )
    headers["authorization"] = (
        f"{ALGORITHM} Credential={access_key_id}/{scope}, SignedHeaders={';'.join(signed)}, Signature={signature}"
    )
    return headers
