"""Constraint detection, `constraint-rules-v2`: a sentence splitter and a classifier of directives.

`split_sentences(text)` gives the sentences of a message, each an exact substring (so a pin made from one
is verbatim in the message):
- fenced code blocks (```` ``` ```` or `~~~`) are skipped whole, and inline code (`` `...` ``) is never split;
- every line is split on its own (a line break ends a sentence), and a bullet or numbered list item is a
  sentence without its marker (`- `, `* `, `1. `, `(2) `); lines of tool documentation pasted into a
  prompt (`docstring:`, `signature:`, `arguments:`, as SWE-agent writes them) are skipped;
- inside a line a sentence ends at `.`, `!` or `?` (closing quotes/brackets included) followed by white
  space and a capital letter, digit, quote or bracket; so `data/sales.csv`, `os.path.join` and `1.2.3`
  never split, and neither do the abbreviations in `ABBREVIATIONS` (e.g., i.e., Mr., U.S., ...) or a
  single capital initial (`J. Smith`).

`classify(sentence)` gives `prohibition`, `limit`, `obligation` or None. It reads the sentence with its
inline code masked and emphasis marks (`_ONE_`, `*SINGLE*`) removed, refuses questions, headings and
labels (`## Book flight`, `**Expected behavior**`, `RESPONSE FORMAT:`) and tool-documentation lines
(`docstring:`, `signature:`, `arguments:`), then looks for a directive to the agent:
- prohibition: an imperative `do not` / `don't` / `never` / `avoid` at the start of the sentence or right
  after punctuation or a linking word (`please`, `so`, `and`, `then`, `just`, `instead`, `you`, ...), so
  "I don't ..." and "it never ..." are not imperatives, and not `don't have to` / `don't need to`; a
  negated modal whose subject is the agent or the user (`you`, `the agent`, `the assistant`, `the user`,
  `your response`, ...): `must not`, `should not`, `may not`, `cannot`, `are not allowed to`,
  `can ... but not`; a passive rule `cannot be <done>` / `must not be <done>`;
- limit: a bound on a number (`at most N`, `no more than N`, `not more than N`, `up to N`,
  `maximum of N`, `at least N`, `no fewer/less than N`, `minimum of N`, `exactly N`, `keep ... under N`),
  or `only` restricting an action (`Only call ...`, `can only`, `... only if`, `answer with the number
  only`, `one ... at a time`, `your task is to ... only/minimal/without/non-...`);
- obligation: an imperative `always`, `make sure` (not `to make sure`, a purpose), `ensure`,
  `be sure to`, `remember to`; a modal whose subject is the agent or the user: `must`, `should`,
  `need(s) to`, `have/has to`, `is/are required to` (not after `if`, and not a bare `you need to.`); an
  impersonal `must` (`All passengers must fly ...`); `requires you/the user to`; `Do every/each ...`.
Statements of fact with a negation ("I don't have the reservation ID handy", "it doesn't work", "there
is no file"), first-person wishes ("I need to cancel"), expected behaviour written about code ("mypy
shouldn't error", "it should be True") and permissions ("you can use any bash command") are not
directives and give None. The first matching kind in the order prohibition, limit, obligation wins.

`RULES_V2` is the `RuleSet` registered under `constraint-rules-v2` in `ctxkit.context.pins.DETECTORS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

__all__ = ["ABBREVIATIONS", "KINDS", "RuleSet", "RULES_V2", "split_sentences", "classify", "code_spans"]

ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "cf.", "al.", "approx.", "Mr.", "Mrs.", "Ms.", "Dr.", "Prof.",
                 "St.", "Jr.", "Sr.", "No.", "Fig.", "U.S.", "U.K.", "a.m.", "p.m.")
"""Words ending in a period that never end a sentence (compared case-insensitively)."""


@dataclass(frozen=True)
class RuleSet:
    """A named, versioned constraint detector: a sentence splitter and a sentence classifier."""

    name: str
    """Registered name, recorded in each detected pin's `rule` as `<name>:<kind>`."""
    split: Callable[[str], list[str]]
    """Sentences of a message text, each an exact substring of it."""
    classify: Callable[[str], "str | None"]
    """The constraint kind of one sentence (`prohibition`, `limit`, `obligation`) or None."""

    def find(self, text: str) -> list[tuple[str, str]]:
        """(sentence, kind) of every constraint sentence in `text`, in order."""
        out = []
        for sentence in self.split(text):
            kind = self.classify(sentence)
            if kind is not None:
                out.append((sentence, kind))
        return out


# ------------------------------------------------------------------------------------- splitting

_FENCE_OPEN = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_ITEM = re.compile(r"^\s*(?:[-*+•]\s+|\d{1,3}[.)]\s+|\(\d{1,3}\)\s+|[a-z][.)]\s+)")
_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9])")
_ABBR_END = re.compile(
    r"(?:^|(?<=[\s(\[\"']))(?:" + "|".join(re.escape(a[:-1]) for a in ABBREVIATIONS) + r"|[A-Z])\.$", re.IGNORECASE)


def code_spans(line: str) -> list[tuple[int, int]]:
    """(start, end) of each inline code span (`` `...` ``) in one line."""
    return [m.span() for m in _INLINE_CODE.finditer(line)]


def _split_line(line: str, offset: int, out: list[tuple[int, int]]) -> None:
    spans = code_spans(line)
    start = 0
    for m in _END.finditer(line):
        end = m.end()
        if any(a < end <= b for a, b in spans):
            continue  # inside inline code
        head = line[start:m.start() + 1]
        if m.group(0).startswith(".") and not m.group(0).startswith("..") and _ABBR_END.search(head):
            continue
        out.append((offset + start, offset + end))
        start = end
    out.append((offset + start, offset + len(line)))


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` under `constraint-rules-v2`, each an exact substring, stripped; code skipped."""
    pieces: list[tuple[int, int]] = []
    fence: str | None = None
    pos = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        m = _FENCE_OPEN.match(body)
        if fence is not None:
            if m and m.group(1) == fence:
                fence = None
        elif m:
            fence = m.group(1)
        elif not _TOOL_DOC.match(body):
            item = _ITEM.match(body)
            skip = item.end() if item else 0
            _split_line(body[skip:], pos + skip, pieces)
        pos += len(line)
    out = []
    for a, b in pieces:
        s = text[a:b].strip()
        if re.search(r"[A-Za-z]", s):
            out.append(s)
    return out


# ------------------------------------------------------------------------------------- classifying

_NUM = r"(?:\$?\d[\d,.]*%?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|single)"
_WHO = r"(?:you|the agent|the assistant|the model|the user|users|agents|your (?:output|response|answer|reply|code|fix|patch))"
_LEAD = r"(?:^|[,;:(]\s*|\b(?:please|so|and|but|then|just|simply|also|instead|therefore|thus|otherwise|you)\s+)"

_HEADING = re.compile(r"^(?:#{1,6}\s|\*\*[^*]+\*\*:?$|__[^_]+__$|[A-Z][A-Z /&-]{2,}:$|[\w /&-]{1,40}:$)")
_TOOL_DOC = re.compile(r"^\s*(?:docstring|signature|arguments)\s*:", re.IGNORECASE)

_PROHIBITION = (
    re.compile(_LEAD + r"(?:do not|don't|don’t|never|avoid)\b(?!\s+(?:have|need)\s+to\b)", re.IGNORECASE),
    re.compile(r"\b" + _WHO + r"\s+(?:\w+\s+)?(?:must not|mustn't|should not|shouldn't|shall not|may not|cannot|can't|can not|"
               r"are not allowed to|is not allowed to|are not permitted to|is not permitted to|are never|should never|must never)\b",
               re.IGNORECASE),
    re.compile(r"\b" + _WHO + r"\s+can\s+(?:\w+\s+){1,3}?but\s+(?:not|cannot|can't)\b", re.IGNORECASE),
    re.compile(r"\b(?:cannot|can't|can not|must not|mustn't|may not)\s+be\s+\w+(?:ed|en|t)\b", re.IGNORECASE),
)
_LIMIT = (
    re.compile(r"\b(?:at most|no more than|not more than|up to|a maximum of|maximum of|at least|no fewer than|no less than|"
               r"a minimum of|minimum of|exactly)\s+" + _NUM + r"(?![\w-])", re.IGNORECASE),
    re.compile(r"^(?:please\s+)?(?:keep|stay)\b[^.;]*\b(?:under|below|within)\s+" + _NUM + r"(?![\w-])", re.IGNORECASE),
    re.compile(r"^(?:please\s+)?only\b", re.IGNORECASE),
    re.compile(_LEAD + r"only\s+(?:reply|respond|answer|output|use|call|make|edit|modify|change|include|return|write|run)\b",
               re.IGNORECASE),
    re.compile(r"\b(?:can|may|should|must)\s+only\b|\b(?:can|may)\s+be\s+\w+\s+only\s+(?:if|when)\b", re.IGNORECASE),
    re.compile(r"\b(?:answer|reply|respond|output|return)\b[^.;]*\b(?:only|alone)\b", re.IGNORECASE),
    re.compile(r"\b(?:one|a single)\s+\w+(?:\s+\w+)?\s+at a time\b", re.IGNORECASE),
    re.compile(r"\byour (?:task|job|goal) is to\b.*\b(?:only|minimal|without|non-\w+)\b", re.IGNORECASE),
)
_OBLIGATION = (
    re.compile(_LEAD + r"(?:always|ensure|be sure to|remember to)\b", re.IGNORECASE),
    re.compile(r"(?<!\bto )\bmake sure\b", re.IGNORECASE),
    re.compile(r"(?<!\bif )\b" + _WHO + r"\s+(?:\w+\s+)?(?:must|should|shall|needs? to|have to|has to|are required to|"
               r"is required to|are expected to|is expected to)\b(?!\s*(?:and|or|do so|[,.;:!)]|$))", re.IGNORECASE),
    re.compile(r"^(?:please\s+)?do\s+(?:every|each)\b", re.IGNORECASE),
    re.compile(r"\b(?:all|every|each|any)\s+[\w ]{1,40}?\s+must\b|\b\w+s\s+must\b|\bmust\s+(?:first|always|be)\b", re.IGNORECASE),
    re.compile(r"\brequires?\s+" + _WHO + r"\s+to\b", re.IGNORECASE),
)


_EMPHASIS = re.compile(r"(?<![\w])[_*]+(\w[^_*]*?)[_*]+(?![\w])")  # _ONE_, *SINGLE*, **bold**


def _prepare(sentence: str) -> str:
    text = _INLINE_CODE.sub(" CODE ", sentence) if "`" in sentence else sentence
    if "_" in text or "*" in text:
        text = _EMPHASIS.sub(r"\1", text)
    return text.replace("’", "'").strip()


# Per pattern above, literals (lower case) of which every match contains at least one: an ASCII sentence
# holding none of a pattern's literals cannot match it, so the regex search (slow where a pattern starts
# with `_LEAD` or `\b`, tried at every position) is skipped. Only ASCII text is filtered this way: there
# `str.lower` is exactly the case folding of `re.IGNORECASE`.
_NEEDS = {
    "prohibition": (
        ("do not", "don't", "don’t", "never", "avoid"),
        ("must not", "mustn't", "should not", "shouldn't", "shall not", "may not", "cannot", "can't", "can not",
         "not allowed to", "not permitted to", "are never", "should never", "must never"),
        ("but",),
        ("cannot", "can't", "can not", "must not", "mustn't", "may not"),
    ),
    "limit": (
        ("at most", "more than", "up to", "maximum of", "at least", "fewer than", "less than", "minimum of", "exactly"),
        ("keep", "stay"),
        ("only",),
        ("only",),
        ("only",),
        ("only", "alone"),
        ("at a time",),
        ("your task is to", "your job is to", "your goal is to"),
    ),
    "obligation": (
        ("always", "ensure", "be sure to", "remember to"),
        ("make sure",),
        ("must", "should", "shall", "need to", "needs to", "have to", "has to", "required to", "expected to"),
        ("every", "each"),
        ("must",),
        ("require",),
    ),
}
for _kind, _pats in (("prohibition", _PROHIBITION), ("limit", _LIMIT), ("obligation", _OBLIGATION)):
    if len(_NEEDS[_kind]) != len(_pats):  # zip below would silently leave a pattern unsearched
        raise RuntimeError(f"constraints: {_kind} has {len(_pats)} patterns but {len(_NEEDS[_kind])} literal sets in _NEEDS")
KINDS = tuple((kind, pats, tuple(zip(pats, map(frozenset, _NEEDS[kind]))))
              for kind, pats in (("prohibition", _PROHIBITION), ("limit", _LIMIT), ("obligation", _OBLIGATION)))
"""The classifier's patterns: `(kind, patterns, ((pattern, literals one of which every match holds), ...))`,
in priority order."""
_LITERALS = tuple(sorted({k for needs in _NEEDS.values() for need in needs for k in need if k.isascii()}))


def _search(patterns: tuple[re.Pattern[str], ...], text: str) -> bool:
    return any(p.search(text) for p in patterns)


def classify(sentence: str, *, prefilter: bool = True) -> str | None:
    """The constraint kind of one sentence under `constraint-rules-v2` (see the module docstring), or None.
    `prefilter=False` searches every pattern (the same answer, slower: what the prefilter is tested against)."""
    raw = sentence.strip()
    if not raw or raw.endswith("?") or _TOOL_DOC.match(raw) or _HEADING.match(raw):
        return None
    text = _prepare(raw)
    if not (prefilter and text.isascii()):
        return next((kind for kind, pats, _ in KINDS if _search(pats, text)), None)
    low = text.lower()
    present = {k for k in _LITERALS if k in low}
    if not present:
        return None
    for kind, _, filtered in KINDS:
        for p, need in filtered:
            if not need.isdisjoint(present) and p.search(text):
                return kind
    return None


RULES_V2 = RuleSet("constraint-rules-v2", split_sentences, classify)
"""The `constraint-rules-v2` detector."""
