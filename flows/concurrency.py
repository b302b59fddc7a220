"""Prefect global concurrency limits the loop's flows take, so GPU work never oversubscribes a node.

A flow that generates with a model holds one slot of the ``gpu`` limit per batch. On a cluster, create
the limit once (``prefect gcl create gpu --limit <flow runs at once>``, see infra/OPERATIONS.md); where
it does not exist (a laptop) the slot is granted at once. Outside a Prefect run nothing is taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["GPU_LIMIT", "gpu_slot"]

#: Name of the global concurrency limit of GPU-bound work.
GPU_LIMIT = "gpu"


@contextmanager
def gpu_slot(use_prefect: bool) -> Iterator[None]:
    """Hold one slot of :data:`GPU_LIMIT` for the block (only in a Prefect run)."""
    if not use_prefect:
        yield
        return
    from prefect.concurrency.sync import concurrency

    with concurrency(GPU_LIMIT, occupy=1, strict=False):
        yield
