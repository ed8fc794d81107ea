"""How an agent turn that is not a tool call ends an episode: typed ends, never a silent failed answer."""

from __future__ import annotations

from ctxkit.experiment.agents.base import AgentTurn
from ctxkit.experiment.episode import _act_on


def _turn(finish_reason: str) -> AgentTurn:
    return AgentTurn(token_ids=(), content=None, tool_calls=(), finish_reason=finish_reason)


def test_aborted_generation_is_a_truncation_not_a_failed_answer():
    # e.g. the OpenAI agent's HTTP timeout: the episode was cut by a limit, nothing was answered.
    end, tool_s = _act_on(None, None, _turn("abort"))
    assert (end.outcome, end.cause, end.reward, end.reward_kind) == ("truncated", "generation_aborted", None, "limit_truncation")
    assert tool_s == 0.0


def test_generation_cut_by_length_is_a_length_truncation():
    end, _ = _act_on(None, None, _turn("length"))
    assert (end.outcome, end.cause, end.reward, end.reward_kind) == ("truncated", "max_new_tokens", None, "length_truncation")
