"""Prompts in the step formats of the papers, as chat messages or plain text.

- ``step_k``: ``Step k:`` lines with the 2-shot prompt of EpicPRM (appendix A.1): a system prompt that
  asks for numbered steps and ``The final answer is:``, then two worked examples.
- ``double_newline``: steps separated by a blank line (``\\n\\n``), the format of Qwen's PRM work
  ("Lessons", Sec. 2: responses are split "using the delimiter \\n\\n") and of ProcessBench; prompted
  with the Qwen2.5-Math chain-of-thought system prompt and a ``\\boxed{}`` final answer.
- ``step_k_arith``: ``Step k:`` lines after four worked arithmetic examples, as plain text
  (``Question: ...`` blocks, no chat template even for a chat model), for the arithmetic curriculum.
  Measured with SmolLM2-135M-Instruct (48 samples per cell; docs/sampling.md names the command):
  it solves far more one-step sums this way than with EpicPRM's chat prompt and MATH examples, whose
  LaTeX a 135M model imitates instead of adding (see docs/sampling.md's table).

A *prompt format* (what the model reads) determines a *step format* (how its steps are written and
split: :func:`step_format`); ``step_k_arith`` solutions are ``step_k`` solutions.

A prompt for sampling ends where the assistant's response starts; a prompt for rollouts (continuing a
prefix of steps) is that prompt plus the steps so far, each followed by its separator
(:func:`continuation_prompt`), so the model's next token starts the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "ARITH_EXAMPLES",
    "EPICPRM_EXAMPLES",
    "EPICPRM_RESPONSE_PREFIX",
    "EPICPRM_SYSTEM_PROMPT",
    "PROMPT_FORMATS",
    "QWEN_MATH_SYSTEM_PROMPT",
    "FewShotExample",
    "Message",
    "PromptFormat",
    "StepFormat",
    "arith_prompt",
    "continuation_prompt",
    "format_steps",
    "prompt_format_of",
    "render_chat",
    "render_for",
    "render_plain",
    "response_prefix",
    "solution_messages",
    "solution_prompt",
    "step_format",
    "stop_strings",
]

StepFormat = Literal["step_k", "double_newline"]
PromptFormat = Literal["step_k", "double_newline", "step_k_arith"]
PROMPT_FORMATS: tuple[PromptFormat, ...] = ("step_k", "double_newline", "step_k_arith")
Message = dict[str, str]

EPICPRM_SYSTEM_PROMPT = (
    "You are a powerful agent with broad math knowledge and good at accurate calculation on math "
    "equations. Below is an instruction that describes a task. Continue to finish the response that "
    "appropriately completes the request within a maximum of 40 steps. When outputting each step, mark "
    "the sequence number of each step at the beginning, and explicitly state the final answer after the "
    "final step following the format 'The final answer is:'. After outputting the final answer only "
    "once, be sure to stop outputting."
)
"""EpicPRM appendix A.1, system prompt (verbatim up to spacing)."""

EPICPRM_RESPONSE_PREFIX = "Response: Let's think step by step.\n"
"""How every EpicPRM response begins (appendix A.1)."""

QWEN_MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
"""The Qwen2.5-Math chain-of-thought system prompt (steps come out separated by blank lines)."""


@dataclass(frozen=True, slots=True)
class FewShotExample:
    """A worked example: the problem, its steps, and the final-answer sentence."""

    problem: str
    steps: tuple[str, ...]
    final_answer: str


EPICPRM_EXAMPLES: tuple[FewShotExample, ...] = (
    FewShotExample(
        problem=(
            "If the lengths of two sides of a right triangle are 5 and 12 units, what is the least "
            "possible length, in units, of the third side? Express your answer in simplest radical form."
        ),
        steps=(
            "I know that the Pythagorean theorem relates the lengths of the sides of a right triangle by "
            "the equation $a^2+b^2=c^2$, where c is the hypotenuse and a and b are the legs.",
            "Since I don't know which side is the hypotenuse, I'll try both possibilities and see which "
            "one gives me a smaller value for the third side.",
            "If I assume that the hypotenuse is 12, then the other leg must satisfy $5^2+b^2=12^2$, or "
            "$b^2=144-25=119$.",
            "Taking the square root of both sides, I get $b=\\sqrt{119}$, which is already in simplest radical form.",
            "If I assume that the hypotenuse is the unknown side, then it must satisfy $5^2+12^2=c^2$, or "
            "$c^2=25+144=169$.",
            "Taking the square root of both sides, I get $c=\\sqrt{169}=13$.",
            "Comparing the two values, I see that $\\sqrt{119}$ is smaller than 13, since 119 is smaller than 169.",
        ),
        final_answer="The final answer is: $\\sqrt{119}$",
    ),
    FewShotExample(
        problem=(
            "A square has sides of length 10, and a circle centered at one of its vertices has radius 10. "
            "What is the area of the union of the regions enclosed by the square and the circle? Express "
            "your answer in terms of $\\pi$."
        ),
        steps=(
            "I want to find the area of the shaded region in this picture, where the blue is the square "
            "and the red is the circle.",
            "I notice that the circle and the square share a quarter of the circle's area, which is "
            "$\\frac{1}{4}\\pi r^2$, where $r=10$.",
            "So I can subtract that from the sum of the areas of the circle and the square to get the "
            "area of the union.",
            "The area of the circle is $\\pi r^2=100\\pi$, and the area of the square is $s^2=100$, where $s=10$.",
            "So the area of the union is $100\\pi+100-\\frac{1}{4}\\cdot 100\\pi=100+\\frac{3}{4}\\cdot 100\\pi$.",
        ),
        # The paper writes \frac{3}{4}100\pi; math-verify reads that as \frac{3}{4}{1}00\pi, so \cdot.
        final_answer="The final answer is: $100+\\frac{3}{4}\\cdot 100\\pi$",
    ),
)
"""EpicPRM appendix A.1, the two worked examples (LaTeX restored from the paper's rendering)."""


ARITH_EXAMPLES: tuple[FewShotExample, ...] = (
    FewShotExample(
        problem="Ella has 5 cards. She buys 3 more cards. How many cards does Ella have now?",
        steps=("Ella has 5 cards and buys 3 more, so 5 + 3 = 8 cards.",),
        final_answer="The final answer is: 8",
    ),
    FewShotExample(
        problem="Tom has 9 apples. He gives 4 apples to Sam. How many apples does Tom have now?",
        steps=("Tom gives away 4 of his 9 apples, so 9 - 4 = 5 apples.",),
        final_answer="The final answer is: 5",
    ),
    FewShotExample(
        problem="Max has 4 bags with 3 shells in each bag. He loses 2 shells. How many shells does Max have now?",
        steps=("The bags hold 4 * 3 = 12 shells.", "He loses 2, so 12 - 2 = 10 shells."),
        final_answer="The final answer is: 10",
    ),
    FewShotExample(
        problem="Ann has 12 pens. She buys 7 more pens. Then she sells 5 pens. How many pens does Ann have now?",
        steps=("Ann buys 7 more, so 12 + 7 = 19 pens.", "She sells 5, so 19 - 5 = 14 pens."),
        final_answer="The final answer is: 14",
    ),
)
"""Four worked examples in the arithmetic curriculum's style: one equation per step, addition,
subtraction and a product, EpicPRM's ``The final answer is:`` ending (appendix A.1)."""

_ARITH_STOP = ("\n\n", "\nQuestion:")


def step_format(prompt_format: str) -> StepFormat:
    """The step format of a solution's ``prompt_format`` (anything but ``double_newline`` is ``step_k``)."""
    return "double_newline" if prompt_format == "double_newline" else "step_k"


def prompt_format_of(value: str) -> PromptFormat:
    """The prompt format an event's ``prompt_format`` names; an unknown one (an importer's ``chat``)
    is read as its step format, as the scorer always has."""
    for known in PROMPT_FORMATS:
        if value == known:
            return known
    return step_format(value)


def stop_strings(prompt_format: str) -> tuple[str, ...]:
    """Strings that end a solution in ``prompt_format``: a plain few-shot prompt has no end-of-turn
    token, so a solution ends where the model starts the next ``Question:`` block."""
    return _ARITH_STOP if prompt_format == "step_k_arith" else ()


def arith_prompt(problem: str) -> str:
    """The ``step_k_arith`` prompt: :data:`ARITH_EXAMPLES` as ``Question:`` / ``Step k:`` blocks, then
    ``problem``; the model's first token starts ``Step 1:``."""
    blocks = []
    for example in ARITH_EXAMPLES:
        final = f"Step {len(example.steps) + 1}: {example.final_answer}\n"
        blocks.append(f"Question: {example.problem}\n{format_steps(example.steps, 'step_k')}{final}")
    blocks.append(f"Question: {problem.strip()}\n")
    return "\n".join(blocks)


def format_steps(steps: Sequence[str], style: StepFormat, *, start: int = 1) -> str:
    """Join steps in ``style``; each step is followed by its separator so the next one can follow.

    ``step_k``: ``"Step 1: ...\\nStep 2: ...\\n"``; ``double_newline``: ``"...\\n\\n...\\n\\n"``.
    """
    if style == "step_k":
        return "".join(f"Step {start + i}: {step.strip()}\n" for i, step in enumerate(steps))
    return "".join(f"{step.strip()}\n\n" for step in steps)


def _epicprm_response(example: FewShotExample) -> str:
    steps = format_steps(example.steps, "step_k")
    final = f"Step {len(example.steps) + 1}: {example.final_answer}"
    return f"{EPICPRM_RESPONSE_PREFIX}{steps}{final}"


def solution_messages(problem: str, style: StepFormat = "step_k") -> list[Message]:
    """Chat messages asking for a step-by-step solution of ``problem`` in ``style``.

    ``step_k`` is EpicPRM's 2-shot prompt (system prompt, two examples as user/assistant turns, then
    ``Instruction: <problem>``); ``double_newline`` is the Qwen2.5-Math prompt.
    """
    if style == "step_k":
        messages: list[Message] = [{"role": "system", "content": EPICPRM_SYSTEM_PROMPT}]
        for example in EPICPRM_EXAMPLES:
            messages.append({"role": "user", "content": f"Instruction: {example.problem}"})
            messages.append({"role": "assistant", "content": _epicprm_response(example)})
        messages.append({"role": "user", "content": f"Instruction: {problem}"})
        return messages
    return [
        {"role": "system", "content": QWEN_MATH_SYSTEM_PROMPT},
        {"role": "user", "content": problem},
    ]


def response_prefix(style: str) -> str:
    """The text every response in ``style`` starts with (EpicPRM's ``Response: ...``; nothing for Qwen)."""
    return EPICPRM_RESPONSE_PREFIX if style == "step_k" else ""


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> str:
    """The prompt text for a chat model: its chat template with the assistant turn opened.

    Raises:
        ValueError: the tokenizer has no chat template (use :func:`render_plain` for base models).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat template; use prompts.render_plain() for a base model"
        )
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return str(text)


def render_plain(messages: Sequence[Message]) -> str:
    """The prompt text for a base model: system text, then ``Instruction:`` / response blocks."""
    parts = []
    for message in messages:
        content = message["content"].strip()
        parts.append(content if message["role"] != "assistant" else content + "\n")
    return "\n\n".join(parts) + "\n\n"


def continuation_prompt(prompt: str, steps: Sequence[str], style: str) -> str:
    """``prompt`` (rendered, ending where the response starts) plus the response so far.

    The result is what a completer continues for Monte-Carlo rollouts from step ``len(steps)``
    (Math-Shepherd / EpicPRM Sec. 3.1): the response prefix of ``style`` and the steps, each with its
    separator, so the first sampled token begins step ``len(steps) + 1``.
    """
    return prompt + response_prefix(style) + format_steps(steps, step_format(style))


def solution_prompt(model: object, problem: str, style: str) -> str:
    """What a model continues to solve ``problem`` in ``style``: the rendered prompt plus the response prefix.

    ``model`` is a backend (or anything with a ``tokenizer`` attribute); its chat template is used
    when the tokenizer has one, :func:`render_plain` otherwise (base models, engines without a local
    tokenizer). The sampling flow, the step scorer and the rollout completer all build prompts here,
    so a rollout continues exactly the text its solution was sampled from. ``step_k_arith`` is plain
    text for every model (:func:`arith_prompt`).
    """
    if style == "step_k_arith":
        return arith_prompt(problem)
    if style not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {style!r}; choose one of {', '.join(PROMPT_FORMATS)}")
    return render_for(model, solution_messages(problem, step_format(style))) + response_prefix(style)


def render_for(model: object, messages: Sequence[Message]) -> str:
    """``messages`` as ``model`` reads them: its chat template when its tokenizer has one, else plain text."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return render_chat(tokenizer, messages)
    return render_plain(messages)
