"""Thinking history: where training samples split on templates that drop earlier reasoning, against full renders.

For each thinking family TRL ships a stock template for (`THINKING_FAMILIES`: Qwen3, Qwen3.5, Qwen3.6, Qwen3.8,
gpt-oss, DeepSeek R1 distill, GLM-4-MoE, Nemotron 3 nano, LFM2.5; Kimi's templates are not in TRL), over
generated multi-turn episodes with reasoning (`thinking_episodes`: user questions, tool calls with reasoning
beside them, tool results, answers with reasoning), each assistant step is "sampled" as the ids of the turn the
template writes when it is the latest (every third turn written in BPE pieces the tokenizer would merge, as a
policy may), and four pipelines build every step's context:

- *full*: the template's full render of the messages so far (`apply_chat_template`'s ids). A **real rewrite**
  is a transition where the next full render's text does not start with this render's text plus the sampled
  turn's text: the template really changed the rendered prefix (e.g. dropped the reasoning of the turn);
- *naive*: a text-in pipeline: the full render every step, the engine's sampled ids appended; its samples also
  split where only the tokenization changed (**false splits**: no real rewrite there);
- *ctxkit template*: ctxkit's renderer with `history="template"` (the template's render of a turn whose
  reasoning it drops, the sampled ids everywhere else): its samples must split exactly at the real rewrites
  (0 false, 0 missed);
- *ctxkit sampled*: the default `history="sampled"`: sampled ids kept verbatim, so no split at all, each
  dropped reasoning a `thinking_stripped` drift (the context then differs from the template's render);
- *keep reasoning*: where the template has a switch (`THINKING_FAMILIES` value, e.g. `preserve_thinking`),
  the same with `chat_template.with_kwargs` (a distinct template id): its real rewrites and ctxkit splits.

Samples are assembled by `training.episode_samples.assemble_samples` (split reasons by `drift_reasons`).
`python -m ctxkit.benchmarks.thinking_history [--episodes N --turns T] [family ...]` prints the table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxkit.benchmarks.family_conversations import TOOLS
from ctxkit.benchmarks.template_families import family_spec, family_tokenizer
from ctxkit.errors import CtxkitError

THINKING_FAMILIES: dict[str, dict[str, Any] | None] = {
    "qwen3": None,
    "qwen3_5_think": None,
    "qwen3_6": {"preserve_thinking": True},
    "qwen3_8": {"preserve_thinking": True},
    "gptoss": None,
    "deepseek_r1_distill": None,
    "glm4moe": None,
    "nemotron_3_nano": {"truncate_history_thinking": False},
    "lfm2_2_5": {"preserve_thinking": True},
}
"""Thinking family (TRL stock template) -> the template kwargs that keep earlier reasoning (None: no switch)."""


@dataclass(frozen=True)
class ThinkingRow:
    """One family's split counts over the episodes."""

    family: str
    """Stock template name."""
    episodes: int
    """Episodes measured (a refused one is counted in `refused`, not here)."""
    transitions: int
    """Step-to-step transitions over those episodes."""
    real_rewrites: int
    """Transitions where the full render's prefix really changed."""
    naive_splits: int
    """Sample splits of the text-in pipeline (full render every step, sampled ids appended)."""
    naive_false: int
    """Of those, splits without a real rewrite (tokenization only)."""
    template_splits: int
    """Sample splits with ctxkit's `history="template"`."""
    template_false: int
    """Of those, splits without a real rewrite."""
    template_missed: int
    """Real rewrites where `history="template"` did not split."""
    split_reasons: str
    """`history="template"` split reasons, `reason n` joined."""
    sampled_splits: int
    """Sample splits with ctxkit's default `history="sampled"`."""
    sampled_reasons: str
    """Their reasons, `reason n` joined (a template that rewrites prompt tokens, e.g. a prefilled `<think>`
    it drops from history, splits even when every sampled id is kept)."""
    full_mismatch: int
    """Episodes where a `history="template"` context differs from the full render although every turn
    before it was sampled as the template writes it (0 expected: token-exact)."""
    drift_reasons: str
    """Drifts of `history="sampled"` by reason (each once per episode)."""
    keep: str
    """The keep-reasoning kwargs (`-`: the template has none)."""
    keep_rewrites: int | None
    """Real rewrites under the keep-reasoning kwargs (None: no switch)."""
    keep_splits: int | None
    """ctxkit `history="template"` splits under them (None: no switch)."""
    template_id: str
    """Id of the stock template, and of the keep-reasoning variant after ` / ` where there is one."""
    refused: int = 0
    """Episodes ctxkit or the template refused (a typed error), left out of the counts."""
    error: str = ""
    """The first refusal's error."""


def _call(i: int, name: str, args: dict) -> dict:
    return {"id": f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": args}}


def thinking_episodes(n_episodes: int, n_turns: int, tools: bool) -> list[list[dict]]:
    """Deterministic episodes: per user turn, a tool call with reasoning and its result (when `tools`), then
    an answer with reasoning. Assistant messages carry `reasoning_content` (the templates' reasoning field)."""
    out = []
    for e in range(n_episodes):
        msgs: list[dict] = [{"role": "system", "content": f"You are agent {e}. Think, then answer."}]
        for t in range(n_turns):
            msgs.append({"role": "user", "content": f"Question {t} of episode {e}: what is {t + 2} x {e + 3}?"})
            if tools and t % 2 == 0:
                k = 100 * e + t
                msgs.append({"role": "assistant", "content": "",
                             "reasoning_content": f"I should check the table for row {t}.",
                             "tool_calls": [_call(k, "read_file", {"path": f"table_{t}.txt"})]})
                msgs.append({"role": "tool", "tool_call_id": f"call{k:05d}", "name": "read_file",
                             "content": f"row {t}: {(t + 2) * (e + 3)}"})
            msgs.append({"role": "assistant", "content": f"It is {(t + 2) * (e + 3)}.",
                         "reasoning_content": f"{t + 2} times {e + 3} makes {(t + 2) * (e + 3)}."})
        out.append(msgs)
    return out


def _sampled_text(tok: Any, template: Any, profile: Any, msgs: list[dict], k: int, tools: Any) -> str:
    """The text the policy writes for assistant message `k`: the tokens the full render of `msgs[:k + 1]`
    writes after those it shares with the render of `msgs[:k]` with the generation prompt (a prefilled
    `<think>` stays in the prompt), cut after its last turn closer; after a prefilled `<think>` the template
    does not fill, the message's reasoning and `</think>` first."""
    prompt = tok.encode(template.render_text(msgs[:k], tools=tools, add_generation_prompt=True))
    full = tok.encode(template.render_text(msgs[: k + 1], tools=tools))
    p = 0
    while p < min(len(prompt), len(full)) and prompt[p] == full[p]:
        p += 1
    text = tok.decode(full[p:])
    closers = [c for c in (profile.turn_closers or (profile.end_of_turn,)) if c]
    end = max((text.rfind(c) + len(c) for c in closers if c in text), default=len(text))
    text = text[:end]
    reasoning = msgs[k].get("reasoning_content")
    if reasoning and reasoning not in text and tok.decode(prompt).endswith("<think>\n"):
        # a template that never renders reasoning (DeepSeek R1 distill) still prefills `<think>`: the
        # policy writes its reasoning and closes the block before the turn the template writes
        text = f"{reasoning}\n</think>\n\n{text}"
    return text


def _bpe_variant(tok: Any, ids: list[int]) -> list[int]:
    """`ids` with one ordinary token of 4+ characters written as two pieces (same text), or `ids` itself."""
    specials = set(tok.special_tokens.values())
    for i, t in enumerate(ids):
        if t in specials:
            continue
        s = tok.decode([t])
        if len(s.strip()) < 4 or not s.strip().isalpha():
            continue
        cut = len(s) - 2
        pieces = tok.encode(s[:cut]) + tok.encode(s[cut:])
        if pieces != [t] and tok.decode(ids[:i] + pieces + ids[i + 1:]) == tok.decode(ids):
            return ids[:i] + pieces + ids[i + 1:]
    return ids


def _steps(contexts: list[list[int]], sampled: list[list[int]]):
    from ctxkit.events import Step  # lazy: the benchmark's own records
    from ctxkit.text.rendering.output import context_hash  # lazy: L3 part

    for k, (ctx, ids) in enumerate(zip(contexts, sampled)):
        h = context_hash(ctx)
        yield Step(seq=k, context_hash=h, context_length=len(ctx), token_ids=tuple(ids), logprobs=(-0.5,) * len(ids),
                   logprob_kind="processed", sampling={"temperature": 1.0}, policy_version=0), ctx, h


def _split_positions(contexts: list[list[int]], sampled: list[list[int]], tok: Any) -> dict[int, str]:
    """Step index -> split reason, for the steps where a new sample starts (the first step excluded)."""
    from ctxkit.training.episode_samples import EpisodeMeta, assemble_samples  # lazy: L4 part

    meta = EpisodeMeta("ep", None, "unscored", None, "", "", "", "")
    rows = assemble_samples(_steps(contexts, sampled), meta, tokenizer=tok)
    return {s.step_seqs[0]: s.split_reason for s in rows[1:]}


def measure_episode(tok: Any, template: Any, msgs: list[dict], tools: Any, history: str = "template"
                    ) -> dict[str, Any]:
    """One episode through the pipelines (see the module docstring): real rewrite transitions, the naive and
    ctxkit splits (step indexes), the ctxkit drifts, and whether ctxkit's template-history contexts equal
    the full renders where no turn was written in BPE pieces."""
    from ctxkit.text.rendering.renderer import IncrementalRenderer  # lazy: L3 entry point
    from ctxkit.text.template.profile import template_profile  # lazy: L2 entry point

    profile = template_profile(tok, template)
    at = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    texts = [_sampled_text(tok, template, profile, msgs, k, tools) for k in at]
    canon = [tok.encode(t) for t in texts]
    sampled = [_bpe_variant(tok, ids) if n % 3 == 0 else ids for n, ids in enumerate(canon)]
    full = [template.render_text(msgs[:k], tools=tools, add_generation_prompt=True) for k in at]
    real = {n + 1 for n in range(len(at) - 1) if not full[n + 1].startswith(full[n] + texts[n])}
    naive = _split_positions([tok.encode(f) for f in full], sampled, tok)
    out: dict[str, Any] = {"transitions": len(at) - 1, "real": real, "naive": naive}
    for mode in ("template", "sampled"):
        r = IncrementalRenderer(tok, template, tools, history=mode)
        contexts, drifts = [], {}
        j = 0
        for n, k in enumerate(at):
            while j < k:
                m = dict(msgs[j])
                if m["role"] == "assistant":
                    m["token_ids"] = sampled[at.index(j)]
                r.append(m)
                j += 1
            ctx = r.render(add_generation_prompt=True)
            contexts.append(list(ctx.token_ids))
            for d in ctx.drifts:
                drifts[(d.message_index, d.position)] = d.reason
        out[mode] = _split_positions(contexts, sampled, tok)
        out[mode + "_drifts"] = Counter(drifts.values())
        if mode == "template":
            out["equal_full"] = all(c == tok.encode(f) for n, (c, f) in enumerate(zip(contexts, full))
                                    if all(sampled[i] == canon[i] for i in range(n)))
    return out


def family_thinking_row(family: str, shared: Path, root: Path, n_episodes: int, n_turns: int) -> ThinkingRow:
    """The `ThinkingRow` of `family` (its tokenizer written under `root`)."""
    from ctxkit.text.template.chat_template import load_template, with_kwargs  # lazy: L2 entry point
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: L1 entry point

    spec = family_spec(family)
    tok = load_tokenizer(str(family_tokenizer(family, shared, root)))
    template = load_template(None, tok)
    kwargs = THINKING_FAMILIES.get(family)
    keep = with_kwargs(template, kwargs) if kwargs else None
    tools = TOOLS if spec.tools else None
    c: Counter = Counter()
    reasons: Counter = Counter()
    drifts: Counter = Counter()
    sampled_reasons: Counter = Counter()
    refused, error, done = 0, "", 0
    for msgs in thinking_episodes(n_episodes, n_turns, spec.tools):
        try:
            got = measure_episode(tok, template, msgs, tools)
            kept = measure_episode(tok, keep, msgs, tools) if keep is not None else None
        except CtxkitError as exc:
            refused += 1
            error = error or f"{type(exc).__name__}: {exc}"
            continue
        done += 1
        real, tpl = got["real"], got["template"]
        c["transitions"] += got["transitions"]
        c["real"] += len(real)
        c["naive"] += len(got["naive"])
        c["naive_false"] += len(set(got["naive"]) - real)
        c["template"] += len(tpl)
        c["template_false"] += len(set(tpl) - real)
        c["template_missed"] += len(real - set(tpl))
        c["sampled"] += len(got["sampled"])
        c["unequal_full"] += not got["equal_full"]
        reasons.update(tpl.values())
        sampled_reasons.update(got["sampled"].values())
        drifts.update(got["sampled_drifts"])
        if kept is not None:
            c["keep_real"] += len(kept["real"])
            c["keep_splits"] += len(kept["template"])

    def joined(counter: Counter) -> str:
        return ", ".join(f"{r} {n}" for r, n in sorted(counter.items())) or "-"
    return ThinkingRow(
        family=family, episodes=done, transitions=c["transitions"], real_rewrites=c["real"],
        naive_splits=c["naive"], naive_false=c["naive_false"], template_splits=c["template"],
        template_false=c["template_false"], template_missed=c["template_missed"], split_reasons=joined(reasons),
        sampled_splits=c["sampled"], sampled_reasons=joined(sampled_reasons), full_mismatch=c["unequal_full"],
        drift_reasons=joined(drifts),
        keep=",".join(f"{k}={v}" for k, v in kwargs.items()) if kwargs else "-",
        keep_rewrites=c["keep_real"] if keep is not None else None,
        keep_splits=c["keep_splits"] if keep is not None else None,
        template_id=template.id + (f" / {keep.id}" if keep is not None else ""), refused=refused, error=error)


def format_table(rows: list[ThinkingRow]) -> str:
    """The rows as a Markdown table."""
    head = ("| family | episodes | transitions | real rewrites | naive splits (false) | ctxkit template-history "
            "splits (false, missed) | split reasons | ctxkit = full render | ctxkit sampled-history splits | "
            "drifts (sampled history) | keep-reasoning kwargs | rewrites / splits with them | refused |\n"
            + "|---" * 13 + "|")
    body = []
    for r in rows:
        keep = "-" if r.keep_rewrites is None else f"{r.keep_rewrites} / {r.keep_splits}"
        body.append(f"| {r.family} | {r.episodes} | {r.transitions} | {r.real_rewrites} | {r.naive_splits} "
                    f"({r.naive_false}) | {r.template_splits} ({r.template_false}, {r.template_missed}) | "
                    f"{r.split_reasons} | {'yes' if not r.full_mismatch else f'no ({r.full_mismatch})'} | "
                    f"{r.sampled_splits}{' (' + r.sampled_reasons + ')' if r.sampled_splits else ''} | "
                    f"{r.drift_reasons} | {r.keep} | {keep} | "
                    f"{r.refused}{' ' + r.error[:80] if r.error else ''} |")
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    """Print the thinking-history table."""
    from ctxkit.text.tokenizer.tiktoken_files import shared_dir  # lazy: where the shared fixtures are

    parser = argparse.ArgumentParser(prog="python -m ctxkit.benchmarks.thinking_history", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", help=f"thinking families (default: {' '.join(THINKING_FAMILIES)})")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per family (default 4)")
    parser.add_argument("--turns", type=int, default=5, help="user turns per episode (default 5)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ctxkit-thinking-") as tmp:
        rows = [family_thinking_row(f, shared_dir(), Path(tmp), args.episodes, args.turns)
                for f in (args.families or list(THINKING_FAMILIES))]
    print(f"{args.episodes} episodes x {args.turns} user turns per family; every third sampled turn in BPE pieces")
    print(format_table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover - the report script
    sys.exit(main())


__all__ = ["THINKING_FAMILIES", "ThinkingRow", "family_thinking_row", "format_table", "main", "measure_episode",
           "thinking_episodes"]
