"""`check_compressor`: one API check for any compressor, in the spirit of Gymnasium's `check_env`.

It runs the compressor inside a real `ContextBuilder` over hypothesis-generated agent episodes (a
system prompt, a user task stating a constraint, then many assistant turns each making one to three
tool calls with long outputs, sometimes a user follow-up) and builds a context before every assistant
turn, at every budget given. After every build it asserts:

- every active pin is verbatim in the decoded context (and the constraint was detected and pinned);
- no orphaned tool call or result in the view;
- the final render's real token count is within the budget (`expect_fit=False` allows a `BudgetError`
  instead, for strategies that do not compress, such as `keep-all`);
- determinism: a second, independent builder fed the same events appends identical events and builds
  identical ids;
- replay: `rebuild` from the saved events gives the same view hash and token ids.

Note on layering: this check drives the L3 builder, so it imports it lazily; nothing in L2 depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ctxkit.errors import BudgetError, InvariantError

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
    """Builds that raised `BudgetError` (only allowed with `expect_fit=False`)."""
    max_tokens: Mapping[int, int] = field(default_factory=dict)
    """Per budget: the largest context built."""


def episode_strategy(min_turns: int = 6, max_turns: int = 12, max_calls: int = 3, min_words: int = 40,
                     max_words: int = 220):
    """A hypothesis strategy of episode plans: `(system, task, constraint, turns)`, each turn a tuple of
    tool-output word counts, an optional user follow-up and a text seed. Even the simplest plan has
    `min_turns` turns of `min_words`-word outputs, so compaction happens at small budgets."""
    from hypothesis import strategies as st

    turn = st.tuples(
        st.lists(st.integers(min_value=min_words, max_value=max_words), min_size=1, max_size=max_calls),
        st.one_of(st.none(), st.sampled_from(FOLLOW_UPS)),
        st.integers(min_value=0, max_value=10_000),
    )
    return st.tuples(
        st.sampled_from(SYSTEMS), st.sampled_from(TASKS), st.sampled_from(CONSTRAINTS),
        st.lists(turn, min_size=min_turns, max_size=max_turns),
    )


def _text(n_words: int, seed: int) -> str:
    return " ".join(f"{WORDS[(seed + 7 * i) % len(WORDS)]}{(seed + i) % 97}" for i in range(n_words))


def check_compressor(
    spec_or_name: Any,
    *,
    tokenizer: Any,
    template: Any = None,
    budgets: Sequence[int] = (2048, 4096),
    max_examples: int = 5,
    params: Mapping[str, Any] | None = None,
    expect_fit: bool = True,
    min_turns: int = 6,
    max_turns: int = 12,
) -> CheckReport:
    """Run a compressor (registry name, spec, `{"name","params"}` dict or instance) through the checks
    above; raises `InvariantError` (or the builder's typed error) on the first failure, with the
    minimal failing episode printed by hypothesis. Returns what was exercised."""
    from hypothesis import HealthCheck, Phase, example, given, settings

    from ctxkit.builder import ContextBuilder
    from ctxkit.compress import make_compressor
    from ctxkit.templates import load_template
    from ctxkit.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    tmpl = load_template(template, tok)
    probe = make_compressor(spec_or_name, **dict(params or {}))
    stats = {"examples": 0, "builds": 0, "compactions": 0, "budget_errors": 0}
    max_tokens: dict[int, int] = {}

    def fresh():
        if probe is spec_or_name:  # an instance cannot be cloned: both runs share it
            return probe
        return make_compressor(spec_or_name, **dict(params or {}))

    # Outputs sized so the newest turn (up to 3 outputs of ~3 tokens per word) fits half the smallest budget.
    max_words = max(10, min(220, min(budgets) // 18))
    strategy = episode_strategy(min_turns=min_turns, max_turns=max_turns, min_words=max(5, max_words // 4),
                                max_words=max_words)

    # The largest plan always runs first, so every check exercises compaction at every budget.
    largest = (SYSTEMS[0], TASKS[0], CONSTRAINTS[0],
               [([max_words] * 3, FOLLOW_UPS[t % 3] if t % 4 == 3 else None, t) for t in range(max_turns)])

    # No shrinking: each example is many real builds; derandomized, so a failure reproduces as is.
    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(strategy)
    @example(largest)
    def run(plan):
        stats["examples"] += 1
        for budget in budgets:
            a = ContextBuilder(tok, tmpl, fresh(), budget)
            b = ContextBuilder(tok, tmpl, fresh(), budget)
            _run_episode(plan, a, b, tok, tmpl, budget, expect_fit, stats, max_tokens)

    run()
    return CheckReport(compressor=probe.spec.name, budgets=tuple(budgets), examples=stats["examples"],
                       builds=stats["builds"], compactions=stats["compactions"],
                       budget_errors=stats["budget_errors"], max_tokens=dict(max_tokens))


def _run_episode(plan, a, b, tok, tmpl, budget, expect_fit, stats, max_tokens) -> None:
    from ctxkit.builder import MemoryLog, rebuild
    from ctxkit.events import Compaction, EpisodeStart, Message, Step, ToolCall, ToolResult, event_to_dict
    from ctxkit.rendering import encode_assistant_turn
    from ctxkit.view import find_orphans

    system, task, constraint, turns = plan
    log_a, log_b = MemoryLog(), MemoryLog()

    def add(*events):
        log_a.extend(events)
        log_b.extend(events)

    add(EpisodeStart(episode_id="check", tools=TOOLS, context=a.describe()),
        Message(role="system", content=system), Message(role="user", content=f"{task} {constraint}"))
    name = a.compressor.spec.name
    for t, (outputs, follow_up, seed) in enumerate(turns):
        n_before = len(log_a)
        try:
            ctx = a.build(log_a)
        except BudgetError as exc:
            if expect_fit:
                raise InvariantError(f"{name}: BudgetError at budget {budget}, turn {t}: {exc}") from exc
            if str(budget) not in str(exc):
                raise InvariantError(f"{name}: BudgetError does not name the budget {budget}: {exc}") from exc
            stats["budget_errors"] += 1
            return
        ctx_b = b.build(log_b)
        stats["builds"] += 1
        stats["compactions"] += sum(isinstance(e, Compaction) for e in log_a.events()[n_before:])
        where = f"{name}, budget {budget}, turn {t}"
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
        if constraint not in decoded:
            raise InvariantError(f"{where}: the constraint {constraint!r} is not verbatim in the context")
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
            for j in range(len(outputs))
        )
        content = f"Looking at step {t}."
        msg = {"role": "assistant", "content": content, "tool_calls": [c.to_openai() for c in calls]}
        ids = encode_assistant_turn(msg, tok, tmpl, list(TOOLS))
        add(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=ids, content=content, tool_calls=calls))
        add(*[ToolResult(tool_call_id=c.id, name=c.name, content=_text(n, seed + j))
              for j, (c, n) in enumerate(zip(calls, outputs))])
        if follow_up:
            add(Message(role="user", content=follow_up))
