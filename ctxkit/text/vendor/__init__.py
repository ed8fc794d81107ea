"""Vendor renderers as second oracles and as selectable renderers: mistral-common and openai-harmony.

Modules: `oracle` (the closed list of vendor names, `load_vendor`), `mistral` (mistral-common's
`encode_chat_completion`: v3, v7 and Tekken tokenizers shipped in the package), `harmony` (openai-harmony
for gpt-oss, `o200k_harmony` read offline), `vendor_render` (`render(..., template="vendor:<name>")`: ids
from the vendor, loss mask from prefix renders through it) and `compare` (vendor ids against a chat
template's on the same conversation, with the first difference). L3, beside `rendering/`: imports
`rendering/output`, `template/`, `tokenizer/` and L0; the vendor packages load only when a vendor is used.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "VENDORS": "ctxkit.text.vendor.oracle",
    "load_vendor": "ctxkit.text.vendor.oracle",
    "render_vendor": "ctxkit.text.vendor.vendor_render",
    "compare_vendor": "ctxkit.text.vendor.compare",
    "VendorComparison": "ctxkit.text.vendor.compare",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
