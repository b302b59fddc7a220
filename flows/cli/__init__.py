"""The ``prmloop`` command line: one module per command group, options declared by the services' settings.

``store`` (broker, topics, sink, sql, reconcile), ``pipeline`` (prioritize, sample, score, annotate,
judge, consensus, simulate, import, serve, demo), ``stack`` (up, down, deployments),
``prm`` (dataset, train, retrain, models), ``loop`` (run: the loop as a stream), ``credentials`` (kafka,
prefect, engine), ``testset`` (build, show, score), ``bench`` (``bench_learning``: active, learn, deep) and
``evals``. :func:`main` is the console entry point.
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

from prmloop.flows.cli import bench, bench_learning, credentials, evals, loop, pipeline, prm, stack, store, testset
from prmloop.flows.cli.app import app, print_error
from prmloop.flows.cli.options import validation_message
from prmloop.store.auth.credentials import CredentialsError
from prmloop.store.events.codec import PublishError
from prmloop.store.kafka.broker_file import BrokerError
from prmloop.store.tables.duck import ReadOnlyViolation, StoreLocked
from prmloop.store.tables.lake import LakeError

__all__ = ["app", "main"]

_COMMAND_GROUPS = (
    bench,
    bench_learning,
    credentials,
    evals,
    loop,
    pipeline,
    prm,
    stack,
    store,
    testset,
)  # imported for the commands they register


def main() -> None:
    """Entry point: known failures print one actionable line and exit 2, never a traceback."""
    try:
        app()
    except ValidationError as exc:
        _error(validation_message(exc))
    except (
        BrokerError,
        CredentialsError,
        PublishError,
        ReadOnlyViolation,
        StoreLocked,
        LakeError,
        FileNotFoundError,
        ValueError,
        TimeoutError,
    ) as exc:
        _error(str(exc))


def _error(message: str) -> None:
    """One line on stderr, never wrapped, data never read as markup; exit code 2."""
    print_error(message)
    sys.exit(2)


if __name__ == "__main__":
    main()
