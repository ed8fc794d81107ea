"""Vendor renderers by name: `load_vendor("vendor:mistral-v7")` gives the `VendorOracle` of that name.

A vendor renderer is the model vendor's own code for turning a chat request into token ids, used as a
second oracle beside the Hugging Face chat template and, when a user selects it (`render(...,
template="vendor:<name>")`), as the renderer itself:

| name | package | tokenizer (shipped in the package) |
|---|---|---|
| `mistral-v3` | mistral-common | `mistral_instruct_tokenizer_240323.model.v3` (sentencepiece; Mistral 7B v0.3) |
| `mistral-v7` | mistral-common | `mistral_instruct_tokenizer_241114.model.v7` (sentencepiece, `[SYSTEM_PROMPT]`) |
| `mistral-tekken` | mistral-common | `tekken_240911.json` (tiktoken-based Tekken, instruct v3) |
| `harmony` | openai-harmony | `o200k_harmony`: `o200k_base.tiktoken` read offline plus the harmony specials (gpt-oss) |
| `harmony-keep-analysis` | openai-harmony | the same, with earlier analysis (reasoning) kept in history |

Nothing downloads: mistral-common's tokenizer files are inside its wheel, and openai-harmony reads
`o200k_base.tiktoken` from the first of `tiktoken_search_dirs()` that holds it (through its
`TIKTOKEN_ENCODINGS_BASE` variable, set only while the encoding loads); where none does, loading is a
`TokenizerError` naming the folders searched. An unknown name is a `TemplateError` listing the known ones.
Oracles are cached per name; the vendor packages are imported only when one is loaded.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Protocol, Sequence

from ctxkit.errors import TemplateError

VENDOR_PREFIX = "vendor:"
"""A `template=` spec starting with this names a vendor renderer."""

VENDORS: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral-v3": ("mistral", {"file": "mistral_instruct_tokenizer_240323.model.v3"}),
    "mistral-v7": ("mistral", {"file": "mistral_instruct_tokenizer_241114.model.v7"}),
    "mistral-tekken": ("mistral", {"file": "tekken_240911.json"}),
    "harmony": ("harmony", {"keep_analysis": False}),
    "harmony-keep-analysis": ("harmony", {"keep_analysis": True}),
}
"""Vendor name -> (adapter, its options): the closed list `load_vendor` accepts."""


class VendorOracle(Protocol):
    """What every vendor adapter gives (`mistral.MistralOracle`, `harmony.HarmonyOracle`)."""

    name: str
    """The vendor name (`VENDORS` key)."""
    package: str
    """The distribution that renders (`mistral-common`, `openai-harmony`)."""
    version: str
    """Its installed version (part of `template_id`)."""

    @property
    def template_id(self) -> str:
        """`vendor:<name>/<package>-<version>@sha256:<16 hex>` (sha256 over the tokenizer file and options)."""

    @property
    def tokenizer_id(self) -> str:
        """`<package>:<tokenizer>@sha256:<16 hex>` of the vendor's own tokenizer file."""

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
               add_generation_prompt: bool, *, history: bool = False) -> list[int]:
        """The vendor's ids for OpenAI `messages` (and tool schemas). `history`: render a final assistant
        turn as it appears when more turns follow (harmony closes it with `<|end|>`, not `<|return|>`).
        A conversation the vendor rejects is a `VendorRenderError`."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens written out."""

    def sections(self) -> Sequence[tuple[str, str]]:
        """`(marker text, section kind)` pairs: the section a token sits in is named by the last marker
        before it in the decoded render (`compare.first_difference`)."""


_CACHE: dict[str, VendorOracle] = {}
_LOCK = threading.Lock()


def vendor_name(spec: str) -> str:
    """The vendor name of `vendor:<name>` (or a bare `<name>`); a `TemplateError` when it is not in `VENDORS`."""
    name = spec[len(VENDOR_PREFIX):] if spec.startswith(VENDOR_PREFIX) else spec
    if name not in VENDORS:
        raise TemplateError(f"unknown vendor renderer {spec!r}; available: "
                            f"{[VENDOR_PREFIX + n for n in sorted(VENDORS)]}")
    return name


def is_vendor_spec(spec: Any) -> bool:
    """Whether a `template=` value names a vendor renderer (a string starting with `vendor:`)."""
    return isinstance(spec, str) and spec.startswith(VENDOR_PREFIX)


def load_vendor(spec: str) -> VendorOracle:
    """The oracle of `vendor:<name>` (cached); `TemplateError` for an unknown name, `ConfigError` when the
    vendor package is not installed, `TokenizerError` when its tokenizer file cannot be found offline."""
    name = vendor_name(spec)
    with _LOCK:
        hit = _CACHE.get(name)
        if hit is None:
            kind, options = VENDORS[name]
            if kind == "mistral":
                from ctxkit.text.vendor.mistral import MistralOracle  # lazy: mistral-common loads only here

                hit = MistralOracle.load(name, options["file"])
            else:
                from ctxkit.text.vendor.harmony import HarmonyOracle  # lazy: openai-harmony loads only here

                hit = HarmonyOracle.load(name, keep_analysis=options["keep_analysis"])
            _CACHE[name] = hit
        return hit


__all__ = ["VENDORS", "VENDOR_PREFIX", "VendorOracle", "is_vendor_spec", "load_vendor", "vendor_name"]
