"""The judges' prompts and the parsing of their answers.

Step-wise verification uses the template of the CoT Entropy paper (appendix A.1): a rationale, then
``"has_error": "yes"/"no"`` in JSON. The paper found that a prompt raising the JSON parsing rate
matters; with small judges we also open the assistant's answer with ``{"reasoning": "`` so the
model writes the object rather than talking about it. A judgment that is not valid JSON with a
yes/no ``has_error`` is *unparsed*: recorded as such, never guessed.

The whole-solution critic uses the Qwen "Lessons" appendix prompt (the ProcessBench critic
protocol): paragraphs in ``<paragraph_k>`` tags, analyses in ``<analysis_k>`` tags, and a
``<conclusion>`` of Correct / Incorrect; the first wrong paragraph is the last one analysed when the
conclusion is Incorrect.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from prmloop.models.prompts import Message

__all__ = [
    "JSON_PREFIX",
    "ParsedJudgment",
    "critic_messages",
    "parse_critic",
    "parse_judgment",
    "step_messages",
]

STEP_TEMPLATE = """You are a professional mathematician. Given a problem and the previously proposed steps, \
your task is to evaluate whether the next proposed step contains any errors in relation to the preceding \
steps, giving your reasoning. If there is an error, state "yes". If there is no error, state "no". Focus \
solely on the transition from the previous step to the next. The evaluation should adhere to the following \
criteria:

1. Accuracy: Verify all calculations, including algebraic manipulations and numerical computations, are correct.
2. Logical Progression: Ensure the next proposed step follows logically from the previous step, applying \
mathematical rules, theorems, or formulas correctly, and making reasonable observations. Note: Omit this \
criterion if the step being evaluated is the first step, as there are no preceding steps to compare.
3. Step-by-Step Focus: Evaluate only the immediate transition from the previous step to the next proposed \
step. Do not mark the next step as incorrect for not performing an action that should logically occur in a \
future step.

Problem: {problem}
Preceding Steps: {preceding}

Next Proposed Step to be Evaluated: {step}

Now, generate your response in the following JSON format. Give your reasoning in short and concise \
sentences after "reasoning", then output your final evaluation after "has_error".

{{ "reasoning": "Your reasoning here.", "has_error": "yes/no" }}"""

#: What the judge's answer is opened with (see the module docstring).
JSON_PREFIX = '{"reasoning": "'

CRITIC_TEMPLATE = """I will provide a math problem along with a solution. They will be formatted as follows:
[Math Problem]
<math_problem>
...(math problem)...
</math_problem>
[Solution]
<paragraph_1>
...(paragraph 1 of solution)...
</paragraph_1>
...
<paragraph_n>
...(paragraph n of solution)...
</paragraph_n>
Your task is to review each paragraph of the solution in sequence, analyzing, verifying, and critiquing \
the reasoning in detail. You need to provide the analyses and the conclusion in the following format:
<analysis_1>
...(analysis of paragraph 1)...
</analysis_1>
...
<analysis_n>
...(analysis of paragraph n)...
</analysis_n>
<conclusion>
Correct/Incorrect
</conclusion>
* When you analyze each paragraph, you should use proper verification, recalculation, or reflection to \
indicate whether it is logically and mathematically valid. Please elaborate on the analysis process carefully.
* If an error is detected in any paragraph, you should describe the nature and cause of the error in detail, \
and suggest how to correct the error or the correct approach. Once a paragraph is found to contain any \
error, stop further analysis of subsequent paragraphs (as they may depend on the identified error) and \
directly provide the conclusion of "Incorrect".
* Respond with your analyses and conclusion directly.

The following is the math problem and the solution for your task:
[Math Problem]
<math_problem>
{problem}
</math_problem>
[Solution]
{paragraphs}"""


def step_messages(problem: str, steps: Sequence[str], index: int) -> list[Message]:
    """The step-wise verification prompt for step ``index`` of ``steps`` (0-based)."""
    if not 0 <= index < len(steps):
        raise IndexError(f"step {index} is outside the {len(steps)} steps")
    preceding = "\n".join(steps[:index]) if index else "None (this is the first step)"
    text = STEP_TEMPLATE.format(problem=problem.strip(), preceding=preceding, step=steps[index].strip())
    return [{"role": "user", "content": text}]


def critic_messages(problem: str, steps: Sequence[str]) -> list[Message]:
    """The ProcessBench critic prompt: the steps as tagged paragraphs."""
    paragraphs = "\n".join(f"<paragraph_{k}>\n{s.strip()}\n</paragraph_{k}>" for k, s in enumerate(steps, start=1))
    return [{"role": "user", "content": CRITIC_TEMPLATE.format(problem=problem.strip(), paragraphs=paragraphs)}]


@dataclass(frozen=True, slots=True)
class ParsedJudgment:
    """A valid judgment: the decision, the rationale, and where the decision word starts.

    ``decision_at`` is the offset in the judge's own text (after :data:`JSON_PREFIX`) where the value
    of ``has_error`` begins; ``options`` are the (error, no-error) words that could stand there, the
    tokens Eq. 5 normalises over.
    """

    has_error: bool
    reasoning: str
    decision_at: int
    options: tuple[str, str]


_DECISION_RE = re.compile(r'"has_error"\s*:\s*("?)')
_YES_NO = {"yes": True, "no": False}


def parse_judgment(completion: str) -> ParsedJudgment | None:
    """The judgment in ``completion`` (the text the judge wrote after :data:`JSON_PREFIX`), or ``None``.

    Valid: ``JSON_PREFIX + completion`` starts with one JSON object (anything after it is ignored)
    whose ``reasoning`` is a string and whose ``has_error`` is ``"yes"``/``"no"`` (any case) or a JSON
    boolean.
    """
    text = JSON_PREFIX + completion
    try:
        obj, _ = json.JSONDecoder().raw_decode(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("reasoning"), str):
        return None
    value = obj.get("has_error")
    if isinstance(value, bool):
        has_error, options = value, ("true", "false")
    elif isinstance(value, str) and value.strip().lower() in _YES_NO:
        has_error, options = _YES_NO[value.strip().lower()], ("yes", "no")
    else:
        return None
    match = _DECISION_RE.search(text)
    if match is None:  # a key spelt with escapes: valid JSON, but no place to read Eq. 5 from
        return None
    return ParsedJudgment(has_error, obj["reasoning"], match.end() - len(JSON_PREFIX), options)


_CONCLUSION_RE = re.compile(r"<conclusion>\s*(correct|incorrect)\b", flags=re.IGNORECASE)
_ANALYSIS_RE = re.compile(r"<analysis_(\d+)>")


def parse_critic(completion: str, n_steps: int) -> int | str | None:
    """The critic's first wrong step (0-based), ``None`` for "Correct", or ``"unparsed"``.

    The first wrong paragraph is the last ``<analysis_k>`` before an Incorrect conclusion (the
    protocol stops analysing at the first error); a ``k`` outside the solution is unparsed.
    """
    conclusion = _CONCLUSION_RE.search(completion)
    if conclusion is None:
        return "unparsed"
    if conclusion.group(1).lower() == "correct":
        return None
    analysed = [int(k) for k in _ANALYSIS_RE.findall(completion[: conclusion.start()])]
    if not analysed or not 1 <= analysed[-1] <= n_steps:
        return "unparsed"
    return analysed[-1] - 1
