"""The sink's garbage-collection policy: automatic collection off inside, cycles freed when due."""

from __future__ import annotations

import gc
import weakref

from prmloop.store.kafka.records import collected_between_batches


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_inside_the_block_only_the_yielded_function_collects_and_only_when_due() -> None:
    assert gc.isenabled()
    with collected_between_batches(every_s=3600.0) as maybe_collect:
        assert not gc.isenabled()
        ref = weakref.ref(_Node())
        junk = [[] for _ in range(50_000)]  # tracked allocations far past every automatic threshold
        del junk
        assert ref() is not None, "no automatic collection may run inside the block"
        assert maybe_collect() is False
        assert ref() is not None, "not due yet: nothing collected"
    assert gc.isenabled(), "the collector is switched back on"
    gc.collect()
    assert ref() is None


def test_a_due_collection_frees_cycles_made_inside_the_block() -> None:
    with collected_between_batches(every_s=0.0) as maybe_collect:
        ref = weakref.ref(_Node())
        assert ref() is not None
        assert maybe_collect() is True
        assert ref() is None


def test_a_disabled_collector_stays_disabled_after_the_block() -> None:
    gc.disable()
    try:
        with collected_between_batches():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
