"""Pins: constraints that must stay verbatim in every context while active.

Explicit pins are `Pin` events (rule `explicit`); an `Unpin` retires one. The rule-based detector finds
constraint sentences in user and system messages (never in tool output, which the policy does not
author and an attacker might) with a versioned rule set, `constraint-rules-v1`:

- `prohibition`: "do not", "don't", "never", "must not", "mustn't", "should not", "shouldn't",
  "may not", "cannot", "can't", "avoid";
- `limit`: "at most", "at least", "no more than", "no fewer than", "no less than", "not more than",
  "fewer than", "less than", "more than", "within", "up to", "maximum of", "minimum of", "limit(ed) to",
  "under", "below", "exceed" followed by a number (digits or one..twenty);
- `obligation`: "must", "always", "make sure", "ensure", "be sure to", "required to", "have to".

A sentence matching several kinds takes the first in that order. The builder records each new detection
as a `Pin` event (rule `<rule set>:<kind>`, e.g. `constraint-rules-v1:prohibition`) before using it, so the
view stays a pure function of the log; a detection whose pin id was ever recorded (even if later unpinned)
is not recorded again.

Rule sets are versioned and registered in `DETECTORS` (an explicit `name -> "module:attr"` dict), so a log
keeps the meaning it was recorded with: `constraint-rules-v1` (above, unchanged) and `constraint-rules-v2`
(`ctxkit.context.constraints`: a splitter that survives abbreviations, paths, code and lists, and directives
only, not negated statements of fact). Replay never re-runs a detector (it reads the recorded `Pin`
events); a builder records its rule set's name (`pin_rules`) so a resumed episode detects with the same
one (`resolve_pin_rules`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ctxkit.context.constraints import RuleSet
from ctxkit.errors import ConfigError
from ctxkit.events import Event, Message, Pin, Unpin, content_text
from ctxkit.registry import load_registered

RULESET = "constraint-rules-v1"
"""Name of the first rule set (the one `detect_constraints` uses when none is named; recorded in pins' `rule`)."""

LATEST_RULES = "constraint-rules-v2"
"""The newest registered rule set (the one to choose for new episodes)."""

DETECTORS: dict[str, str] = {
    "constraint-rules-v1": "ctxkit.context.pins:RULES_V1",
    "constraint-rules-v2": "ctxkit.context.constraints:RULES_V2",
}
"""Explicit registry of constraint detectors: rule-set name -> "module:attr" of its `RuleSet`."""

_NUM = r"(?:\d[\d,.]*|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty)"
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("prohibition", re.compile(
        r"\b(?:do not|don't|don’t|never|must not|mustn't|should not|shouldn't|may not|cannot|can't|avoid)\b",
        re.IGNORECASE)),
    ("limit", re.compile(
        r"\b(?:at most|at least|no more than|no fewer than|no less than|not more than|fewer than|less than|"
        r"more than|within|up to|maximum of|minimum of|limit(?:ed)? to|under|below|exceed)\s+" + _NUM + r"\b",
        re.IGNORECASE)),
    ("obligation", re.compile(
        r"\b(?:must|always|make sure|ensure|be sure to|required to|have to)\b", re.IGNORECASE)),
)
"""The `constraint-rules-v1` rules, in priority order: (kind, pattern)."""

_SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?](?=[^\s.!?]))+(?:[.!?]+|$)", re.MULTILINE)
"""A sentence ends at `.`, `!` or `?` followed by whitespace or the end, or at a line break (`parse.py` stays whole)."""


@dataclass(frozen=True)
class Detection:
    """A constraint sentence found by the detector."""

    text: str
    """The sentence, exactly as it appears in the message."""
    source_event_id: str
    """The message it comes from."""
    rule: str
    """`constraint-rules-v1:<kind>` (kind: prohibition, limit, obligation)."""
    pin_id: str
    """Deterministic pin id: `pin-` + 12 hex of sha256(source event id, text)."""

    def to_pin(self) -> Pin:
        """The (un-appended) `Pin` event recording this detection."""
        return Pin(pin_id=self.pin_id, text=self.text, source_event_id=self.source_event_id, rule=self.rule)


def active_pins(events: Iterable[Event]) -> tuple[Pin, ...]:
    """The pins active after `events` (recorded order), Unpins applied."""
    pins: dict[str, Pin] = {}
    for e in events:
        if isinstance(e, Pin):
            pins[e.pin_id] = e
        elif isinstance(e, Unpin):
            pins.pop(e.pin_id, None)
    return tuple(pins.values())


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, each an exact substring, stripped of surrounding whitespace."""
    out = []
    for m in _SENTENCE.finditer(text):
        s = m.group(0).strip()
        if s:
            out.append(s)
    return out


def classify(sentence: str) -> str | None:
    """The constraint kind of a sentence under `constraint-rules-v1`, or None."""
    for kind, pattern in RULES:
        if pattern.search(sentence):
            return kind
    return None


RULES_V1 = RuleSet(RULESET, split_sentences, classify)
"""The `constraint-rules-v1` detector (kept unchanged so recorded logs keep their meaning)."""


def get_detector(name: str) -> RuleSet:
    """The `RuleSet` registered under `name` (`ConfigError` naming the registered ones if unknown)."""
    if not isinstance(name, str):
        raise ConfigError(f"pin rules {name!r}: expected a registered rule-set name, one of {sorted(DETECTORS)}")
    return load_registered(DETECTORS, name, "pin rule set")


def resolve_pin_rules(detect_pins: bool | str | None, *, default: str = LATEST_RULES) -> str | None:
    """The rule-set name a builder option means: False/None -> None (no detection), True -> `default`,
    a name -> that name once checked against `DETECTORS` (a recorded `pin_rules` passes through as is)."""
    if detect_pins is None or detect_pins is False:
        return None
    if detect_pins is True:
        return default
    get_detector(detect_pins)
    return detect_pins


def pin_id_for(source_event_id: str, text: str) -> str:
    """Deterministic pin id of a detected constraint."""
    return "pin-" + hashlib.sha256(f"{source_event_id}\x00{text}".encode()).hexdigest()[:12]


def detect_constraints(
    events: Iterable[Event], *, roles: Sequence[str] = ("user", "system"), rules: str = RULESET,
) -> list[Detection]:
    """Every constraint sentence in the `Message` events with one of `roles`, in log order, found by the
    registered rule set `rules`. Tool output (`ToolResult` events, `tool` messages) and tool descriptions
    are never read unless asked: pass `roles=("user", "system", "tool")` to read `tool` messages too."""
    detector = get_detector(rules)
    found: list[Detection] = []
    for e in events:
        if not isinstance(e, Message) or e.role not in roles or not e.id:
            continue
        for sentence, kind in _find(detector, content_text(e.content)):
            found.append(Detection(sentence, e.id, f"{detector.name}:{kind}", pin_id_for(e.id, sentence)))
    return found


_FOUND: dict[tuple[str, str], tuple] = {}  # (detector name, text) -> its detections


def _find(detector: RuleSet, text: str) -> tuple:
    """`detector.find(text)`, kept by content: a detector is a pure function of the text, and every builder
    of a run (one per arm, episode and repeat) reads the same system prompt and task."""
    key = (detector.name, text)
    hit = _FOUND.get(key)
    if hit is None:
        hit = tuple(detector.find(text))
        if len(_FOUND) >= 4096:
            _FOUND.clear()
        _FOUND[key] = hit
    return hit


def clear_detection_cache() -> None:
    """Forget the detections kept by text (benchmarks start each pass cold with it)."""
    _FOUND.clear()


def new_detections(events: Sequence[Event], *, start: int = 0, rules: str = RULESET) -> list[Detection]:
    """Detections (rule set `rules`) in `events[start:]` whose pin id was never recorded in `events`
    (pinned or unpinned)."""
    seen = {e.pin_id for e in events if isinstance(e, (Pin, Unpin))}
    out = []
    for d in detect_constraints(events[start:], rules=rules):
        if d.pin_id not in seen:
            seen.add(d.pin_id)
            out.append(d)
    return out
