"""A question's sampled solutions as rollouts from its start ``s_0``, for the annotator's ``MC(s_0)``.

A solution the sampler drew from a question is a draw from the same distribution as an MC rollout from
``s_0`` when the same model continued the same prompt at the same temperature and nucleus mass: it
reached the gold answer or it did not (the sampler graded it), and its log-probability sum is what
MC-PPL weighs it by (EpicPRM Eq. 1-2). So the annotator counts a question's samples as the first
rollouts of ``s_0`` and generates only what the adaptive sampling asks for beyond them; a question
whose probes were both wrong costs two rollouts fewer, and one a probe solved costs none. A sample
longer than the rollouts' token budget counts as a rollout that ran out of tokens (incorrect), which
is what a rollout with that budget would have been.

Every sample the annotator reads counts, whatever the selector decided and whether it is correct, in the
order they came: which samples count does not depend on their outcome. Only samples of the prompt
format a solution was sampled in count for it: another format is another start ``s_0``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prmloop.models.annotation.completer import Completer, GeneratorCompleter, Rollout
from prmloop.store.events import ModelRef, SampleAsRollout, SolutionSelected, StepsScored

__all__ = ["QuestionSamples", "RolloutSpec", "rollout_specs"]


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """What a completer's rollouts are drawn with; a sample drawn otherwise is not one of them."""

    model: ModelRef
    temperature: float
    top_p: float
    max_new_tokens: int


def rollout_specs(completers: Sequence[Completer], refs: Sequence[ModelRef]) -> list[RolloutSpec | None]:
    """Each completer's :class:`RolloutSpec`; ``None`` for one that is not a model's (a simulator) or
    whose model is not named in ``refs`` (the k-th ref names the k-th completer's model)."""
    return [
        RolloutSpec(refs[k], c.params.temperature, c.params.top_p, c.params.max_new_tokens)
        if isinstance(c, GeneratorCompleter) and k < len(refs)
        else None
        for k, c in enumerate(completers)
    ]


class QuestionSamples:
    """The graded samples of the newest ``max_questions`` questions (thread-safe), each once, kept apart
    by the prompt format they were sampled in."""

    def __init__(self, max_questions: int = 1000) -> None:
        self.max_questions = max_questions
        self._samples: OrderedDict[tuple[str, str | None], dict[str, tuple[SampleAsRollout, str | None, bool]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def add_all(self, payloads: Sequence[object]) -> None:
        """:meth:`add` each ``StepsScored`` of ``payloads``, bare or in a ``SolutionSelected``."""
        for payload in payloads:
            scored = payload.scored if isinstance(payload, SolutionSelected) else payload
            if isinstance(scored, StepsScored):
                self.add(scored)

    def add(self, scored: StepsScored) -> None:
        """Keep ``scored`` as a sample of its question (nothing when it came without log-probs). One that
        states no answer the sampler could grade counts as wrong, as such a rollout does."""
        if scored.as_rollout is None:
            return
        answer = scored.final_answer if scored.correct is not None else None
        key = (scored.question_id, scored.prompt_format)
        with self._lock:
            kept = self._samples.setdefault(key, {})
            self._samples.move_to_end(key)
            kept.setdefault(scored.solution_id, (scored.as_rollout, answer, bool(scored.correct)))
            while len(self._samples) > self.max_questions:
                self._samples.popitem(last=False)

    def rollouts(
        self, question_id: str, prompt_format: str | None, specs: Sequence[RolloutSpec | None]
    ) -> list[list[tuple[Rollout, bool]]]:
        """Per completer, the question's samples in ``prompt_format`` drawn as its rollouts are, graded, in
        the order they came."""
        with self._lock:
            samples = list(self._samples.get((question_id, prompt_format), {}).values())
        out: list[list[tuple[Rollout, bool]]] = []
        for spec in specs:
            graded: list[tuple[Rollout, bool]] = []
            for sample, answer, correct in samples:
                if spec is None or not _drawn_as(sample, spec):
                    continue
                if sample.completion_tokens > spec.max_new_tokens:
                    # A rollout with this budget would have stopped before the sample's answer.
                    first = sample.sum_logprob * spec.max_new_tokens / sample.completion_tokens  # its share
                    rollout = Rollout(None, spec.max_new_tokens, first, finish_reason="length")
                    graded.append((rollout, False))
                else:
                    graded.append((Rollout(answer, sample.completion_tokens, sample.sum_logprob), correct))
            out.append(graded)
        return out


def _drawn_as(sample: SampleAsRollout, spec: RolloutSpec) -> bool:
    return (
        sample.generator == spec.model
        and abs(sample.temperature - spec.temperature) < 1e-9
        and abs(sample.top_p - spec.top_p) < 1e-9
    )
