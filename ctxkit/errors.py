"""Typed errors. Every failure ctxkit reports on bad input is a `CtxkitError` naming what and where.
"""

from __future__ import annotations


class CtxkitError(Exception):
    """Base class of every error ctxkit raises on purpose."""


class ConfigError(CtxkitError, ValueError):
    """A parameter, option or config value is invalid (names the parameter and the allowed values)."""


class MessageFormatError(CtxkitError, ValueError):
    """A chat message is malformed: unknown role, unsupported content type, tool result without a call."""


class EventFormatError(CtxkitError, ValueError):
    """An event field holds a value outside its closed vocabulary (e.g. `EpisodeEnd.reward_kind`).

    `kind`, `field`, `value` and `allowed` say which event kind, which field, what was given and what is allowed."""

    def __init__(self, kind: str, field: str, value: object, allowed: tuple):
        super().__init__(f"{kind} event: {field}={value!r} is not one of {list(allowed)}")
        self.kind, self.field, self.value, self.allowed = kind, field, value, tuple(allowed)

    def __reduce__(self):
        return type(self), (self.kind, self.field, self.value, self.allowed)


class AlignmentError(EventFormatError):
    """A per-token field of an event (`Step.logprobs`, `Step.raw_logprobs`) that is not as long as the
    event's `token_ids`. An `EventFormatError`: `kind` and `field` say which event kind and field, `value`
    is the field's length and `allowed` the one length it may have (`(len(token_ids),)`)."""

    def __init__(self, kind: str, field: str, length: int, n_tokens: int):
        Exception.__init__(self, f"{kind} event: {field} has {length} entries for {n_tokens} token_ids; "
                                 "they must be aligned, one per sampled token")
        self.kind, self.field, self.value, self.allowed = kind, field, length, (n_tokens,)

    def __reduce__(self):
        return type(self), (self.kind, self.field, self.value, self.allowed[0])


class LogFormatError(CtxkitError):
    """An event log is malformed or corrupt. `path` and `line` (1-based) say where, when known."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


class TornLineError(LogFormatError):
    """The last line of a log is incomplete (a crash mid-append); `repair()` drops it safely."""


class SchemaVersionError(LogFormatError):
    """The log was written with a schema version this ctxkit cannot read."""


class LogLockedError(CtxkitError):
    """Another writer holds an event log (an `EventLog` opened with `lock="writer"` holds it until closed).
    `path` names the log and `holder` the holder (`"pid 123 on host ..."`), None when unknown."""

    def __init__(self, message: str, *, path: str | None = None, holder: str | None = None):
        super().__init__(f"{path}: {message}" if path is not None else message)
        self.path, self.holder = path, holder

    def __reduce__(self):
        return _rebuild_locked_error, (str(self), self.path, self.holder, type(self))


def _rebuild_locked_error(text: str, path, holder, cls: type | None = None) -> "LogLockedError":
    """Unpickle a `LogLockedError` (or a subclass, `cls`) without adding its path prefix twice."""
    exc = (cls or LogLockedError).__new__(cls or LogLockedError)
    Exception.__init__(exc, text)
    exc.path, exc.holder = path, holder
    return exc


class TokenizerError(CtxkitError):
    """A tokenizer could not be loaded or used."""


class TemplateError(CtxkitError):
    """A chat template is missing, fails its sha256 check, or failed to render (sandbox violations included)."""


class RenderError(CtxkitError):
    """A conversation could not be rendered, or its loss mask could not be derived."""


class VendorRenderError(RenderError):
    """A vendor renderer (`template="vendor:<name>"`: mistral-common, openai-harmony) refused a conversation,
    or the loss mask of its render could not be derived. `vendor` names the vendor template (`mistral-v7`),
    `reason` says what the vendor or the mask derivation said, and `message_index` the message, when known."""

    def __init__(self, vendor: str, reason: str, message_index: int | None = None):
        where = f" (message {message_index})" if message_index is not None else ""
        super().__init__(f"vendor:{vendor}{where}: {reason}")
        self.vendor, self.reason, self.message_index = vendor, reason, message_index

    def __reduce__(self):
        return type(self), (self.vendor, self.reason, self.message_index)


class BudgetError(CtxkitError):
    """A context does not fit its token budget (e.g. pins plus the fixed prefix exceed it); names the sizes."""


class PinViolationError(CtxkitError):
    """An active pin is missing from a built context."""


class InvariantError(CtxkitError):
    """A built context broke an invariant (orphaned tool call or result, budget overrun, non-determinism)."""


class ReplayError(CtxkitError):
    """A replayed context differs from the recorded one, or the recorded template/tokenizer hash differs."""


class StateError(CtxkitError):
    """An external-state snapshot or restore was refused (unsafe path, link out of the target, size mismatch)."""


class ImportFormatError(CtxkitError, ValueError):
    """A trajectory file cannot be imported: unknown shape, or an episode or turn that breaks its format's
    rules (e.g. a text tool call that does not parse). `path`, `line` (1-based, in a JSONL file), `episode` and
    `turn` say where, when known."""

    def __init__(self, message: str, *, path: str | None = None, episode: str | None = None, turn: int | None = None,
                 line: int | None = None):
        file = "" if path is None else f"{path}:{line}: " if line is not None else f"{path}: "
        where = "".join(part for part in (file, f"episode {episode}: " if episode is not None else "",
                                           f"turn {turn}: " if turn is not None else ""))
        super().__init__(where + message)
        self.path, self.episode, self.turn, self.line = path, episode, turn, line

    def __reduce__(self):
        return _rebuild_import_error, (str(self), self.path, self.episode, self.turn, self.line)


def _rebuild_import_error(text: str, path, episode, turn, line=None) -> "ImportFormatError":
    """Unpickle an `ImportFormatError` without adding its location prefix twice."""
    exc = ImportFormatError.__new__(ImportFormatError)
    Exception.__init__(exc, text)
    exc.path, exc.episode, exc.turn, exc.line = path, episode, turn, line
    return exc


PAIRING_PROBLEMS = ("orphaned_result", "pending_call", "unanswered_call", "duplicated_result")
"""What a `ToolPairingError` reports: a tool result with no call before it; a call with no result yet
(legal only in the last assistant turn); a call followed by later turns without its result; a second
result for a call already answered."""


class ToolPairingError(InvariantError, MessageFormatError):
    """Tool calls and results do not pair up. `problem` is one of `PAIRING_PROBLEMS`; `event` names the
    event (id and seq) or message index at fault and `call_id` the call (None when re-raised with a
    message only, as `type(exc)(text)` does). Both an `InvariantError` (a built
    view) and a `MessageFormatError` (a message list)."""

    def __init__(self, message: str, *, problem: str | None = None, event: str | None = None, call_id: str | None = None):
        super().__init__(message)
        self.problem, self.event, self.call_id = problem, event, call_id

    def __reduce__(self):
        return _rebuild_pairing_error, (str(self), self.problem, self.event, self.call_id)


def _rebuild_pairing_error(text: str, problem: str, event, call_id) -> "ToolPairingError":
    """Unpickle a `ToolPairingError`."""
    return ToolPairingError(text, problem=problem, event=event, call_id=call_id)


class SpecialTokenError(MessageFormatError):
    """Special-token text found in a message's content under `special_tokens="error"`. `message_index`,
    `role`, `token` and `char` (offset in the content) say where."""

    def __init__(self, message: str, *, message_index: int | None = None, role: str | None = None,
                 token: str | None = None, char: int | None = None):
        super().__init__(message)
        self.message_index, self.role, self.token, self.char = message_index, role, token, char

    def __reduce__(self):
        return _rebuild_special_error, (str(self), self.message_index, self.role, self.token, self.char)


def _rebuild_special_error(text: str, message_index: int, role: str, token: str, char: int) -> "SpecialTokenError":
    """Unpickle a `SpecialTokenError`."""
    return SpecialTokenError(text, message_index=message_index, role=role, token=token, char=char)


class LogForkedError(LogLockedError):
    """An `EventLog` handle used in a process forked from the one that opened it (`os.fork`, a multiprocessing
    worker started by `fork`): the parent still owns the handle (its locks and its buffered events), so in the
    child it writes nothing and refuses appends. Open the log again in the child. `path` names the log and
    `holder` the parent (`"pid 123"`)."""


class GatewayError(CtxkitError):
    """A request the recording gateway (`ctxkit serve`) refuses or could not serve. `status` is the HTTP status
    it answers with, `param` the request field at fault (None when none), `code` an OpenAI-style error code."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def __reduce__(self):
        return _rebuild_gateway_error, (str(self), self.status, self.param, self.code)


def _rebuild_gateway_error(text: str, status: int, param, code) -> "GatewayError":
    """Unpickle a `GatewayError`."""
    return GatewayError(text, status=status, param=param, code=code)
