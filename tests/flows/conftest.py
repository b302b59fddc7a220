"""Fixtures of the flow tests: one throw-away Prefect API for the whole session's flow runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary Prefect server and database (started once: it takes seconds on this machine)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
