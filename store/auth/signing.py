"""Signed facts: the events that change what the loop runs are put in force only when prmloop made them.

Tansu has no ACLs, and Kafka clients choose their own ``producer`` names: any client that reaches the
broker could publish a ``ModelRegistered`` with ``promoted: true`` (the issue's "mallory") or a
``CalibrationFitted``. So the flows that produce them (retrain, calibrate) sign the payload with an
HMAC-SHA256 key from the credentials file (:mod:`prmloop.store.auth.credentials`), and what puts a model
or a calibration in force (:func:`prmloop.store.tables.registry.current_model`, the selector's ensemble,
``prmloop models list``, ``prmloop status``) checks it: an unsigned or badly signed one is stored like
any fact but never in force, and said so.

The signature covers the event type and the payload without its ``signature`` field, as the payload's
own schema writes it in JSON (keys sorted), so a stored copy read back verifies as the original did.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from prmloop.store.events import PAYLOAD_TYPES, CalibrationFitted, ModelRegistered, Payload

__all__ = ["SIGNED_EVENT_TYPES", "sign", "signature_status"]

#: The events whose payload carries a signature, and is in force only when it verifies.
SIGNED_EVENT_TYPES = frozenset({"ModelRegistered", "CalibrationFitted"})
_SCHEME = "hmac-sha256:"

P = TypeVar("P", ModelRegistered, CalibrationFitted)


def _key(key: bytes | None) -> bytes:
    if key is not None:
        return key
    from prmloop.store.auth.credentials import load_credentials

    return load_credentials().signing_key


def _digest(payload: Payload, key: bytes) -> str:
    body = payload.model_dump(mode="json", exclude={"signature"})
    event_type = str(body.get("event_type", ""))
    text = event_type + "\n" + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _SCHEME + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(payload: P, key: bytes | None = None) -> P:
    """``payload`` with its signature (key: the credentials file's, by default)."""
    return payload.model_copy(update={"signature": _digest(payload, _key(key))})


def signature_status(
    event_type: str, payload: Payload | Mapping[str, Any] | str, key: bytes | None = None
) -> Literal["verified", "unsigned", "bad signature"]:
    """Whether a (stored) payload of a signed event type was signed with ``key``."""
    if isinstance(payload, str):
        payload = json.loads(payload)
    if not isinstance(payload, Payload):
        try:
            payload = PAYLOAD_TYPES[event_type].model_validate(dict(payload))
        except (KeyError, ValidationError):
            return "bad signature"
    given = getattr(payload, "signature", None)
    if not given:
        return "unsigned"
    # As bytes: compare_digest refuses str with non-ASCII characters, which a hostile stored event may carry.
    expected = _digest(payload, _key(key)).encode()
    return "verified" if hmac.compare_digest(str(given).encode(), expected) else "bad signature"
