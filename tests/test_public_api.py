"""The public face: lazy, fast, and every name in `ctxkit.__all__` is the documented object.

A public function never shares its name with a submodule (Python would rebind `ctxkit.<name>` to the
module the moment anything imports it), so the checks run in a fresh interpreter *after* importing every
submodule, and call each public function by its public name on real inputs.
"""

from __future__ import annotations

import inspect
import pkgutil
import subprocess
import sys
import textwrap
import types

import ctxkit

from conftest import REPO_ROOT, tokenizer_dir

FUNCTIONS = {
    "render", "samples", "replay", "resume", "load_tokenizer", "load_template", "check_template",
    "build_view", "check_compressor", "make_compressor", "context_hash", "encode_assistant_turn",
    "read_episodes", "add_offline_steps", "compressed_samples", "iter_events",
}
"""The public names that are functions; every other public name is a class or a constant."""


def submodule_names() -> list[str]:
    """Every module inside the ctxkit package."""
    return sorted(m.name for m in pkgutil.walk_packages(ctxkit.__path__, "ctxkit."))


def test_no_public_name_is_also_a_submodule():
    clashes = sorted(name for name in ctxkit.__all__ if f"ctxkit.{name}" in submodule_names())
    assert clashes == []


def test_public_names_are_functions_classes_or_constants():
    kinds = {name: type(getattr(ctxkit, name)).__name__ for name in ctxkit.__all__}
    assert {n for n, k in kinds.items() if k == "function"} == FUNCTIONS
    assert not [n for n in ctxkit.__all__ if isinstance(getattr(ctxkit, n), types.ModuleType)]
    assert isinstance(ctxkit.SCHEMA_VERSION, int) and isinstance(ctxkit.__version__, str)
    assert all(inspect.isclass(getattr(ctxkit, n)) for n in ctxkit.__all__ if n not in FUNCTIONS | {"SCHEMA_VERSION", "__version__"})
    assert all(getattr(ctxkit, n).__doc__ for n in ctxkit.__all__ if n != "SCHEMA_VERSION" and n != "__version__")


CALL_EVERY_FUNCTION = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys, tempfile, types
    from pathlib import Path
    import ctxkit
    for info in pkgutil.walk_packages(ctxkit.__path__, "ctxkit."):
        importlib.import_module(info.name)
    bad = [n for n in ctxkit.__all__ if isinstance(getattr(ctxkit, n), types.ModuleType)]
    assert not bad, f"modules under public names after importing every submodule: {bad}"

    tok = ctxkit.load_tokenizer(sys.argv[1])
    template = ctxkit.load_template(None, tok)
    report = ctxkit.check_template(tok, template)
    assert report.end_of_turn == "<|im_end|>", report
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    r = ctxkit.render(messages, tokenizer=tok)
    assert r.token_ids[-3:] == (19, 151645, 198) and r.loss_mask[-3:] == (1, 1, 0), (r.token_ids[-3:], r.loss_mask[-3:])
    assert ctxkit.context_hash(r.token_ids) == r.hash
    assert list(ctxkit.encode_assistant_turn({"role": "assistant", "content": "4"}, tok)) == [19, 151645]
    inc = ctxkit.IncrementalRenderer(tok)
    inc.extend(messages)
    assert inc.render().token_ids == r.token_ids
    ctxkit.make_compressor("window")
    assert ctxkit.check_compressor("window", tokenizer=tok, budgets=(2048,), max_examples=2).examples >= 1

    folder = Path(tempfile.mkdtemp())
    builder = ctxkit.ContextBuilder(tok, compressor="window", budget=4000)
    log = ctxkit.EventLog.create(folder / "ep.jsonl")
    log.append(ctxkit.EpisodeStart(episode_id="ep", context=builder.describe()))
    log.append(ctxkit.Message(role="user", content="2+2?"))
    ctx = builder.build(log)
    ids = ctxkit.encode_assistant_turn({"role": "assistant", "content": "4"}, tok)
    log.append(ctxkit.Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=ids,
                           logprobs=tuple(-0.1 for _ in ids), logprob_kind="processed", content="4",
                           finish_reason="stop"))
    log.append(ctxkit.EpisodeEnd(outcome="terminated", cause="answered", reward=1.0, reward_kind="scored"))
    log.close()
    assert isinstance(ctxkit.build_view(log.events()), ctxkit.View)
    streamed = ctxkit.iter_events(folder / "ep.jsonl")
    assert [e.id for e in streamed] == [e.id for e in log.events()]
    assert ctxkit.replay(folder / "ep.jsonl", step=0).ok
    (sample,) = ctxkit.samples(folder / "ep.jsonl")
    assert sum(sample.loss_mask) == len(ids)
    assert ctxkit.resume(folder / "ep.jsonl").next_step == 1
    assert ctxkit.compressed_samples(folder / "ep.jsonl", compressor="window", budget=4000)[0].token_ids == sample.token_ids

    conversation = folder / "conversation.json"
    conversation.write_text(json.dumps({"messages": messages}))
    (episode,) = ctxkit.read_episodes(conversation)
    offline = ctxkit.add_offline_steps(episode.events, tok)
    assert [e.kind for e in offline if e.kind in ("message", "step")] == ["message", "step"]
    print("ok")
    """
)


def test_every_public_function_called_by_its_public_name_after_importing_every_submodule():
    out = subprocess.run([sys.executable, "-c", CALL_EVERY_FUNCTION, str(tokenizer_dir("qwen2.5-instruct"))],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"


def test_import_ctxkit_loads_no_heavy_dependency():
    code = (
        "import sys, ctxkit, ctxkit.cli.parser; "
        "heavy = [m for m in ('torch', 'transformers', 'faiss', 'sentence_transformers', 'pyarrow', 'ray', 'matplotlib') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
