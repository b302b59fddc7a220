"""Which handler failures are retried (transient) and which make a record poison."""

from __future__ import annotations

import duckdb
from kafka.errors import KafkaTimeoutError

from prmloop.store.kafka.runtime import TransientError, is_transient
from prmloop.store.tables.duck import StoreLocked


class APIConnectionError(Exception):
    """Named like openai's: the store must not import model clients to recognise them."""


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise RuntimeError("the model server call failed") from inner
    except RuntimeError as outer:
        return outer


def test_broker_disk_database_and_network_failures_are_transient() -> None:
    for exc in (
        KafkaTimeoutError(),
        ConnectionRefusedError(),
        OSError(28, "No space left on device"),
        StoreLocked("locked"),
        duckdb.IOException("disk"),
        TransientError("try later"),
        APIConnectionError("server gone"),
        _raised_from(ConnectionResetError()),
    ):
        assert is_transient(exc), exc


def test_bugs_and_bad_data_are_not_transient() -> None:
    for exc in (
        KeyError("x"),
        ValueError("bad"),
        TypeError("bad"),
        RecursionError(),
        duckdb.ConversionException("bad value"),
        _raised_from(ZeroDivisionError()),
    ):
        assert not is_transient(exc), exc
    assert is_transient(KeyError("x"), (KeyError,))  # a service may declare more
