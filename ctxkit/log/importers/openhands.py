"""OpenHands event streams: evaluation output rows (`output.jsonl`, one `{instance_id, history, metrics, error,
test_result, ...}` per line, one episode each) or a bare event list (one episode).

The view is rebuilt from the events the way OpenHands' conversation memory shows them to the model:

| event | becomes |
|---|---|
| `action: system` (`args.content`, `args.tools`) | system message; its `tools` the episode's tools (unless `--tools`) |
| `action: message` from the user / the agent | user / assistant message (`args.content`, else `message`) |
| an agent action with `tool_call_metadata` | the assistant message of its LLM response (`model_response.choices[0].message`: content, every tool call of that response, `reasoning_content`), once per response |
| an observation with `tool_call_metadata` | the tool message answering `tool_call_id` (`name` = `function_name`, content = `content`) |
| `observation: error` with no call (invalid tool arguments: the call never became an action) | a user message with the error text, as OpenHands shows it |
| `recall` actions and observations, other events without a call | not in the view; kept in `metadata["source"]["not_in_view"]` |

Tool status: `observation: error`, or `success: false` (a command's nonzero exit code), makes the tool
message a `ToolResult(status="error")`. Ends: a `finish` call is `terminated` (cause `finish`); a row `error`
(e.g. the iteration limit) is `truncated` with cause `agent_error` and the text in `scores["error"]`;
otherwise `truncated`, `source_ended`. OpenHands rows carry no score: `unscored`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ctxkit.log.importers.common import (ImportedEpisode, Importer, SourceInfo, drop_nulls, ending, episode_events,
                                         id_field, require)

def _is_event(item: Any) -> bool:
    return isinstance(item, Mapping) and "source" in item and ("action" in item or "observation" in item)


def _is_row(item: Any) -> bool:
    return isinstance(item, Mapping) and isinstance(item.get("history"), list) and "instance_id" in item


def matches(obj: Any) -> bool:
    """A non-empty list of evaluation rows (`{instance_id, history}`) or of events (`{source, action|observation}`)."""
    return isinstance(obj, list) and bool(obj) and (_is_row(obj[0]) or _is_event(obj[0]))


def entries(doc: Sequence[Any]) -> Sequence[Any]:
    """Each row is an episode (the rows of a JSONL file may include lines that did not parse); a bare event
    list is one."""
    first = next((item for item in doc if isinstance(item, Mapping)), None)
    return doc if _is_row(first) else [doc]


def entry_problem(item: Any) -> str | None:
    """What keeps `item` from being an OpenHands episode (a row, or an event list), or None."""
    if isinstance(item, list):
        bad = next((i for i, e in enumerate(item) if not _is_event(e)), None)
        return None if bad is None else f"history[{bad}] is not an OpenHands event (needs 'source' and 'action' or 'observation')"
    if not isinstance(item, Mapping):
        return f"an OpenHands row is an object, not {type(item).__name__}"
    return None if _is_row(item) else "field 'history' (a list) or 'instance_id' is missing"


def _response_message(event: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    meta = event.get("tool_call_metadata")
    if not isinstance(meta, Mapping):
        return None
    response = meta.get("model_response") or {}
    try:
        message = response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None
    return str(response.get("id") or meta.get("tool_call_id")), drop_nulls(dict(message))


def _view(history: Sequence[Mapping[str, Any]], source: SourceInfo) -> tuple[list[dict], dict[int, str], list, list]:
    """(messages, tool statuses by message index, tools, events kept out of the view)."""
    messages: list[dict[str, Any]] = []
    statuses: dict[int, str] = {}
    tools: list[Any] = []
    hidden: list[Any] = []
    responses: set[str] = set()
    for turn, event in enumerate(history):
        require(_is_event(event), "not an OpenHands event (needs 'source' and 'action' or 'observation')",
                source, turn=turn)
        args = event.get("args") if isinstance(event.get("args"), Mapping) else {}
        action, observation = event.get("action"), event.get("observation")
        response = _response_message(event)
        meta = event.get("tool_call_metadata") if isinstance(event.get("tool_call_metadata"), Mapping) else {}
        if action == "system":
            messages.append({"role": "system", "content": args.get("content", event.get("message", ""))})
            tools = list(args.get("tools") or [])
        elif action is not None and response is not None:
            if response[0] not in responses:  # one assistant message per LLM response (its calls together)
                responses.add(response[0])
                messages.append({**response[1], "role": "assistant"})
        elif action == "message":
            role = "user" if event.get("source") == "user" else "assistant"
            messages.append({"role": role, "content": args.get("content", event.get("message", ""))})
        elif observation is not None and meta.get("tool_call_id"):
            if observation == "error" or event.get("success") is False:
                statuses[len(messages)] = "error"
            messages.append({"role": "tool", "tool_call_id": meta["tool_call_id"], "name": meta.get("function_name"),
                             "content": event.get("content", ""), "openhands_observation": observation})
        elif observation == "error":
            messages.append({"role": "user", "content": event.get("content", ""), "openhands_observation": "error"})
        else:
            hidden.append(dict(event))
    return messages, statuses, tools, hidden


def _ending(history: Sequence[Mapping[str, Any]], error: Any):
    if any(e.get("action") == "finish" for e in history if isinstance(e, Mapping)):
        return ending(cause="finish")
    if error:
        return ending(cause="agent_error", truncated=True, scores={"error": error})
    return ending()


def read_entry(item: Any, source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """One row (or the bare event list) as an episode."""
    row = item if isinstance(item, Mapping) else {"history": item}
    history = row["history"]
    messages, statuses, own_tools, hidden = _view(history, source)
    metadata = {k: v for k, v in row.items() if k != "history"}
    if hidden:
        metadata["not_in_view"] = hidden
    return episode_events(messages, source=source, tools=own_tools if tools is None else tools, metadata=metadata,
                          task={"name": "openhands", "instance_id": row.get("instance_id")},
                          end=_ending(history, row.get("error")), statuses=statuses)


IMPORTER = Importer(name="openhands", description="OpenHands event streams: evaluation rows {instance_id, history, "
                                                  "...} (JSONL) or a bare event list",
                    matches=matches, entries=entries, entry_problem=entry_problem,
                    entry_id=id_field("instance_id"),
                    read_entry=read_entry)
"""The `openhands` entry of `IMPORTERS`."""
