"""The loop's Prefect deployments on one machine: ``prmloop deployments serve``.

Serves ``prioritize``, ``sample`` (from the prioritized queue), ``monitor``, ``retrain`` and
``calibrate`` as deployments of the Prefect server that ``prmloop up`` starts, so they can be run from
the UI (``Run`` on a deployment) or on a schedule. On a laptop the schedules are off by default (the
embedded model is slow and a scheduled run would take the CPU from everything else); ``--schedule``
turns them on. On a cluster, use
``infra/prefect.yaml`` with work pools instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prmloop.flows.calibrate import calibrate
from prmloop.flows.monitor import monitor
from prmloop.flows.prioritize import prioritize
from prmloop.flows.retrain import retrain
from prmloop.flows.sample import sample
from prmloop.models.questions import data_dir
from prmloop.producers.prioritize import PrioritizeSettings
from prmloop.producers.sampler import SampleSettings
from prmloop.store.settings import StateSettings

__all__ = ["DeploymentPlan", "deployment_plans", "serve_deployments"]


@dataclass(frozen=True)
class DeploymentPlan:
    name: str
    flow: Any
    interval_s: int
    parameters: dict[str, Any]


def deployment_plans(*, questions: int = 20, level: int = 1) -> list[DeploymentPlan]:
    """What the laptop loop serves: small sizes on the arithmetic curriculum, the embedded model."""
    return [
        DeploymentPlan(
            "prioritize",
            prioritize,
            6 * 3600,
            {"settings": PrioritizeSettings(dataset="arith", level=level, limit=questions, k=2, threads=1)},
        ),
        DeploymentPlan(
            "sample",
            sample,
            3600,
            {"settings": SampleSettings(from_queue=True, limit=4, k=4, m=1, n=3, max_new_tokens=256, threads=1)},
        ),
        DeploymentPlan("monitor", monitor, 3600, {"db": str(StateSettings().store_location)}),
        DeploymentPlan(
            "retrain",
            retrain,
            24 * 3600,
            {
                "db": str(StateSettings().store_location),
                "out_dir": str(StateSettings().home / "prm"),
                "min_examples": 8,
            },
        ),
        DeploymentPlan(
            "calibrate",
            calibrate,
            24 * 3600,
            {"pool": str(data_dir() / "bon" / "gsm8k_candidates.jsonl.gz"), "subsamples": 10, "splits": 2},
        ),
    ]


def serve_deployments(*, schedule: bool = False, plans: list[DeploymentPlan] | None = None) -> None:
    """Serve the deployments until interrupted (Prefect's ``serve``)."""
    from prefect import serve

    deployments = [
        plan.flow.to_deployment(
            name=f"{plan.name}-local",
            parameters=plan.parameters,
            interval=plan.interval_s,
            paused=not schedule,
            tags=["prmloop", "local"],
        )
        for plan in plans or deployment_plans()
    ]
    serve(*deployments)
