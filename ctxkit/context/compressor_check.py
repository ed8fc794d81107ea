"""`check_compressor`: one API check for any compressor, in the spirit of Gymnasium's `check_env`.

It runs the compressor inside a real `ContextBuilder` over generated agent episodes (a system prompt, a
user task stating a constraint, then many assistant turns each making one to three tool calls with long
outputs, sometimes a user follow-up) and builds a context before every assistant turn, at every budget
given. After every build it asserts:

- every active pin is verbatim in the decoded context (and the constraint was detected and pinned);
- no orphaned tool call or result in the view;
- the final render's real token count is within the budget (for a compressor whose `fits_budget` is
  False, such as `keep-all` or `mask-observations-v2`, a `BudgetError` naming the budget is accepted
  instead; `expect_fit` overrides);
- determinism: a second, independent builder fed the same events appends identical events and builds
  identical ids;
- replay: `rebuild` from the saved events gives the same view hash and token ids.

Episodes come from a seeded `random.Random` (no test extras needed): the largest plan first (every turn
at the most calls and words, so every check exercises compaction at every budget), then `max_examples`
random plans. The same `seed` gives the same episodes, so a failure reproduces as is; the error names
the compressor, budget, turn and the plan's index.

It lives in `context/` beside the builder because checking a compressor means building and rendering contexts with it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ctxkit.context.builder import ContextBuilder, rebuild
from ctxkit.context.compress import make_compressor
from ctxkit.errors import BudgetError, ConfigError, InvariantError, PinViolationError
from ctxkit.events import Compaction, EpisodeStart, Message, Step, ToolCall, ToolResult, event_to_dict
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.rendering.renderer import encode_assistant_turn
from ctxkit.context.view import find_orphans
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

DEFAULT_TOKENIZER = "tiktoken:o200k_base"
"""Tokenizer used when none is given (its `.tiktoken` file is found offline, see `ctxkit.text.tokenizer.loader`)."""
DEFAULT_TEMPLATE = "chatml-tools-v1"
"""Template used with the default tokenizer (tiktoken encodings carry no chat template)."""

WORDS = (
    "parser token buffer index value return error state module config field record stream offset cache "
    "result header branch commit schema layer signal vector matrix record queue worker thread handle"
).split()
SYSTEMS = ("You are a careful coding agent.", "You are an assistant that uses tools to answer.")
TASKS = ("Fix the failing parser test.", "Summarize the log files.", "Find the config value for the cache.")
CONSTRAINTS = (
    "Do not modify the original file.",
    "Never delete anything in the data folder.",
    "Use at most 40 tool calls.",
    "You must keep the public API unchanged.",
)
FOLLOW_UPS = ("Keep going.", "Any progress so far?", "Check the next file too.")
TOOLS = (
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                     "required": ["cmd"]}}},
)


@dataclass(frozen=True)
class TurnPlan:
    """One assistant turn of a generated episode."""

    outputs: tuple[int, ...]
    """Word count of each tool output (one tool call per entry)."""
    follow_up: str | None
    """A user message after the tool results, or None."""
    seed: int
    """Seed of the output texts."""


@dataclass(frozen=True)
class EpisodePlan:
    """A generated episode: system prompt, task, the constraint stated with it, and the turns."""

    system: str
    """The system prompt."""
    task: str
    """The user's task."""
    constraint: str
    """A constraint stated with the task (the pin detector must find it and keep it visible)."""
    turns: tuple[TurnPlan, ...]
    """The assistant turns, in order."""


@dataclass(frozen=True)
class CheckReport:
    """What `check_compressor` exercised."""

    compressor: str
    """Versioned name of the compressor checked."""
    budgets: tuple[int, ...]
    """Budgets checked."""
    examples: int
    """Generated episodes run (per budget)."""
    builds: int
    """Contexts built and checked."""
    compactions: int
    """Compaction events recorded."""
    budget_errors: int
    """Builds that raised `BudgetError` (only allowed when the compressor is not expected to fit)."""
    max_tokens: Mapping[int, int] = field(default_factory=dict)
    """Per budget: the largest context built."""


def episode_plans(n: int, *, seed: int = 0, min_turns: int = 6, max_turns: int = 12, max_calls: int = 3,
                  min_words: int = 40, max_words: int = 220) -> list[EpisodePlan]:
    """The largest plan (`max_turns` turns of `max_calls` outputs of `max_words` words), then `n` plans drawn
    from `random.Random(seed)`: `min_turns..max_turns` turns of `1..max_calls` outputs of
    `min_words..max_words` words, a follow-up on about one turn in four."""
    for name, value, low in (("n", n, 0), ("min_turns", min_turns, 1), ("max_calls", max_calls, 1), ("min_words", min_words, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"episode_plans: {name} is {value!r}; expected an integer >= {low}")
    if max_turns < min_turns or max_words < min_words:
        raise ConfigError(f"episode_plans: need min_turns <= max_turns ({min_turns}, {max_turns}) and "
                          f"min_words <= max_words ({min_words}, {max_words})")
    largest = EpisodePlan(SYSTEMS[0], TASKS[0], CONSTRAINTS[0], tuple(
        TurnPlan((max_words,) * max_calls, FOLLOW_UPS[t % 3] if t % 4 == 3 else None, t) for t in range(max_turns)))
    rng = random.Random(seed)
    plans = [largest]
    for _ in range(n):
        turns = tuple(
            TurnPlan(tuple(rng.randint(min_words, max_words) for _ in range(rng.randint(1, max_calls))),
                     rng.choice(FOLLOW_UPS) if rng.random() < 0.25 else None, rng.randint(0, 10_000))
            for _ in range(rng.randint(min_turns, max_turns))
        )
        plans.append(EpisodePlan(rng.choice(SYSTEMS), rng.choice(TASKS), rng.choice(CONSTRAINTS), turns))
    return plans


def check_compressor(
    spec_or_name: Any,
    *,
    tokenizer: Any = None,
    template: Any = None,
    budgets: Sequence[int] = (2048, 4096),
    max_examples: int = 5,
    seed: int = 0,
    params: Mapping[str, Any] | None = None,
    expect_fit: bool | None = None,
    min_turns: int = 6,
    max_turns: int = 12,
) -> CheckReport:
    """Run a compressor (registry name, spec, `{"name","params"}` dict or instance) through the checks
    above, on the largest plan plus `max_examples` random ones drawn with `seed`.

    `tokenizer` defaults to `DEFAULT_TOKENIZER` rendered with `DEFAULT_TEMPLATE`; `expect_fit` defaults to
    the compressor's `fits_budget`. Raises `InvariantError` (or the builder's typed error) on the first
    failure, naming the plan; returns what was exercised."""
    if not budgets or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in budgets):
        raise ConfigError(f"check_compressor: budgets is {budgets!r}; expected positive integers")
    if tokenizer is None:
        tokenizer, template = DEFAULT_TOKENIZER, DEFAULT_TEMPLATE if template is None else template
    tok = load_tokenizer(tokenizer)
    tmpl = load_template(template, tok)
    probe = make_compressor(spec_or_name, **dict(params or {}))
    if expect_fit is None:
        expect_fit = bool(getattr(probe, "fits_budget", True))

    def fresh():
        if probe is spec_or_name:  # an instance cannot be cloned: both runs share it
            return probe
        return make_compressor(spec_or_name, **dict(params or {}))

    # Outputs sized so the newest turn (up to 3 outputs of ~3 tokens per word) fits half the smallest budget.
    max_words = max(10, min(220, min(budgets) // 18))
    plans = episode_plans(max_examples, seed=seed, min_turns=min_turns, max_turns=max_turns,
                          min_words=max(5, max_words // 4), max_words=max_words)
    stats = {"builds": 0, "compactions": 0, "budget_errors": 0}
    max_tokens: dict[int, int] = {}
    for index, plan in enumerate(plans):
        for budget in budgets:
            a = ContextBuilder(tok, tmpl, fresh(), budget)
            b = ContextBuilder(tok, tmpl, fresh(), budget)
            where = f"plan {index} (seed {seed}; plan 0 is the largest)"
            _run_episode(plan, where, a, b, tok, tmpl, budget, expect_fit, stats, max_tokens)
    return CheckReport(compressor=probe.spec.name, budgets=tuple(budgets), examples=len(plans),
                       builds=stats["builds"], compactions=stats["compactions"],
                       budget_errors=stats["budget_errors"], max_tokens=dict(max_tokens))


def episode_text(n_words: int, seed: int) -> str:
    """A deterministic tool output of `n_words` words."""
    return " ".join(f"{WORDS[(seed + 7 * i) % len(WORDS)]}{(seed + i) % 97}" for i in range(n_words))


def _run_episode(plan: EpisodePlan, plan_where: str, a: ContextBuilder, b: ContextBuilder, tok: Any, tmpl: Any,
                 budget: int, expect_fit: bool, stats: dict[str, int], max_tokens: dict[int, int]) -> None:
    log_a, log_b = MemoryLog(), MemoryLog()

    def add(*events):
        log_a.extend(events)
        log_b.extend(events)

    add(EpisodeStart(episode_id="check", tools=TOOLS, context=a.describe()),
        Message(role="system", content=plan.system), Message(role="user", content=f"{plan.task} {plan.constraint}"))
    name = a.compressor.spec.name
    for t, turn in enumerate(plan.turns):
        where = f"{name}, budget {budget}, {plan_where}, turn {t}"
        n_before = len(log_a)
        try:
            ctx = a.build(log_a)
        except BudgetError as exc:
            if expect_fit:
                raise InvariantError(f"{where}: BudgetError: {exc}") from exc
            if str(budget) not in str(exc):
                raise InvariantError(f"{where}: BudgetError does not name the budget {budget}: {exc}") from exc
            stats["budget_errors"] += 1
            return
        except (InvariantError, PinViolationError) as exc:  # the builder's own checks: say which plan and turn
            raise type(exc)(f"{where}: {exc}") from exc
        ctx_b = b.build(log_b)
        stats["builds"] += 1
        stats["compactions"] += sum(isinstance(e, Compaction) for e in log_a.events()[n_before:])
        if [event_to_dict(e) for e in log_a.events()] != [event_to_dict(e) for e in log_b.events()]:
            raise InvariantError(f"{where}: not deterministic: two builders fed the same log recorded different events")
        if ctx.token_ids != ctx_b.token_ids:
            raise InvariantError(f"{where}: not deterministic: two builders built different token ids")
        if ctx.n_tokens > budget and not ctx.truncated:
            raise InvariantError(f"{where}: context is {ctx.n_tokens} tokens, over the budget of {budget}")
        max_tokens[budget] = max(max_tokens.get(budget, 0), ctx.n_tokens)
        if ctx.truncated:
            return
        decoded = tok.decode(ctx.token_ids)
        if plan.constraint not in decoded:
            raise InvariantError(f"{where}: the constraint {plan.constraint!r} is not verbatim in the context")
        for pin in ctx.view.active_pins:
            if pin.text not in decoded:
                raise InvariantError(f"{where}: pin {pin.pin_id} {pin.text!r} is not verbatim in the context")
        problems = find_orphans(ctx.view.messages)
        if problems:
            raise InvariantError(f"{where}: orphaned tool messages: {problems}")
        replayed = rebuild(log_a.events(), tokenizer=tok, template=tmpl)
        if replayed.view.hash != ctx.view.hash or replayed.token_ids != ctx.token_ids:
            raise InvariantError(f"{where}: rebuild from the saved log differs from the build")
        calls = tuple(
            ToolCall(id=f"call_{t}_{j}", name="read_file" if j % 2 == 0 else "run",
                     arguments=f'{{"path": "src/file_{t}_{j}.py"}}' if j % 2 == 0 else f'{{"cmd": "pytest -k case{t}{j}"}}')
            for j in range(len(turn.outputs))
        )
        content = f"Looking at step {t}."
        msg = {"role": "assistant", "content": content, "tool_calls": [c.to_openai() for c in calls]}
        ids = encode_assistant_turn(msg, tok, tmpl, list(TOOLS))
        add(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=ids, content=content, tool_calls=calls))
        add(*[ToolResult(tool_call_id=c.id, name=c.name, content=episode_text(n, turn.seed + j))
              for j, (c, n) in enumerate(zip(calls, turn.outputs))])
        if turn.follow_up:
            add(Message(role="user", content=turn.follow_up))
