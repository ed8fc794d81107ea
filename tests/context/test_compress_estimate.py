"""The compressors' cheaper decisions give the decisions of the plain ones.

- `SizeEstimate.replaced` (a mask candidate estimated from its masked messages, without building its view)
  equals `estimate_size` on the view the edits give, on generated episodes (hypothesis), whenever
  `mask-observations` takes that path (no pins, one message per event).
- `MaskObservations.mask` returns the edits, details, view and size of the reference search (every
  candidate built and estimated with `estimate_size`), with and without pins, after a truncation.
- `truncate-tool-output` remembers outputs found to fit: a second compaction of the same view, and one by
  a fresh compressor, record the same edits.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.context.compress import make_compressor
from ctxkit.context.compress.base import CompressionRequest
from ctxkit.context.compress.mask_observations import mask_changes, mask_edits
from ctxkit.context.compress.turns import SizeEstimate, estimate_size
from ctxkit.edits import TruncateEdit
from ctxkit.events import ToolResult
from ctxkit.context.view import apply_edits
from test_fit_predicted import tok, view_of

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PLACEHOLDERS = ["[tool output {event_id} masked: {n_tokens} tokens]", "", "({name}: {n_tokens})"]


def request_for(builder, view, log, budget):
    return CompressionRequest(view=view, events=log.events(), tokenizer=builder.tokenizer, template=builder.template,
                              budget=budget, measure=builder.measure,
                              pinned_texts=tuple(p.text for p in view.active_pins), turn_starts=builder.turn_starts)


def originals(log):
    return {e.id: e for e in log.events() if isinstance(e, ToolResult) and e.id}


def truncated(builder, view, log, max_tokens=40):
    """`view` with its tool outputs capped by `truncate-tool-output-v2` (so some are `truncated`)."""
    comp = make_compressor("truncate-tool-output-v2", trigger="every_turn", max_tokens=max_tokens)
    c = comp.compact(request_for(builder, view, log, 10**6))
    return apply_edits(view, c.edits) if c is not None else view


def reference_mask(compressor, request, n_tokens):
    """`MaskObservations.mask` as it was: every candidate built, estimated with `estimate_size`."""
    p = compressor.params
    view = request.view
    keeps = [p["keep_last"]]
    while keeps[-1] > 1:
        keeps.append(keeps[-1] // 2)
    edits, candidate, size, used = [], view, n_tokens, p["keep_last"]
    target = int(p["target_fraction"] * request.budget)
    for i, keep in enumerate(keeps):
        edits = mask_edits(request, view, keep, p["placeholder"], originals_of(request))
        candidate = apply_edits(view, edits, where=compressor.spec.name) if edits else view
        used = keep
        if i < len(keeps) - 1 and estimate_size(request.tokenizer, view, n_tokens, candidate) > target:
            continue
        size = request.measure(candidate)
        if size <= target:
            break
    return edits, {"masked": len(edits), "keep_last_used": used}, candidate.hash, size


def originals_of(request):
    return {e.id: e for e in request.events if isinstance(e, ToolResult) and e.id}


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
@SETTINGS
@given(seed=st.integers(0, 10_000), turns=st.integers(2, 9), keep=st.integers(0, 4),
       placeholder=st.sampled_from(PLACEHOLDERS), cap=st.booleans())
def test_replaced_estimate_equals_estimate_size(name, seed, turns, keep, placeholder, cap):
    t = tok(name)
    builder, view, log = view_of(t, seed, turns)
    if cap:
        view = truncated(builder, view, log)
    n = builder.measure(view)
    request = request_for(builder, view, log, n)
    changes = mask_changes(request, view, keep, placeholder, originals(log))
    edits = [e for _, e in changes]
    candidate = apply_edits(view, edits) if edits else view
    est = SizeEstimate(t, view, n)
    assert est.of(candidate) == estimate_size(t, view, n, candidate)
    if not view.active_pins:
        assert est.replaced([(m, e.text) for m, e in changes]) == estimate_size(t, view, n, candidate)


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
@SETTINGS
@given(seed=st.integers(0, 10_000), turns=st.integers(3, 9), keep_last=st.integers(0, 12),
       fraction=st.floats(0.1, 1.0), budget_fraction=st.floats(0.3, 1.2), cap=st.booleans())
def test_mask_equals_the_reference_search(name, seed, turns, keep_last, fraction, budget_fraction, cap):
    t = tok(name)
    builder, view, log = view_of(t, seed, turns)
    if cap:
        view = truncated(builder, view, log)
    n = builder.measure(view)
    request = request_for(builder, view, log, max(1, int(budget_fraction * n)))
    comp = make_compressor("mask-observations-v2", keep_last=keep_last, target_fraction=fraction)
    edits, details, v, size = comp.mask(request, n)
    assert (edits, details, v.hash, size) == reference_mask(comp, request, n)
    assert size == builder.measure(v)


def test_truncate_remembers_fitting_outputs_without_changing_its_edits():
    t = tok("qwen2.5-instruct")
    builder, view, log = view_of(t, 11, 6)
    request = request_for(builder, view, log, 10**6)
    comp = make_compressor("truncate-tool-output-v2", trigger="every_turn", max_tokens=48)
    first = comp.compact(request)
    again = comp.compact(request)
    fresh = make_compressor("truncate-tool-output-v2", trigger="every_turn", max_tokens=48).compact(request)
    assert first is not None and first.edits == again.edits == fresh.edits
    assert all(isinstance(e, TruncateEdit) for e in first.edits)
    cut = {e.event_id for e in first.edits}
    outputs = {m.provenance.event_ids[0]: m.content for m in view.messages if m.role == "tool"}
    kept = {eid for eid in outputs if eid not in cut}
    assert kept and cut  # the episode has outputs on both sides of the cap
    assert comp.known_to_fit(t) == {outputs[eid] for eid in kept}
    assert all(t.count(outputs[eid]) <= 48 for eid in kept) and all(t.count(outputs[eid]) > 48 for eid in cut)
    # the same compressor with another tokenizer starts over
    t2 = tok("smollm2-135m-instruct")
    b2, v2, log2 = view_of(t2, 11, 6)
    assert comp.known_to_fit(t2) == set()
    comp.compact(request_for(b2, v2, log2, 10**6))
    assert comp.known_to_fit(t) == set()
