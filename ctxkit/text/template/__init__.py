"""Chat templates: versioned, rendered in a sandbox under limits, profiled once per tokenizer.

Modules: `chat_template` (ChatTemplate, load_template), `sandbox` (the Jinja sandbox), `limits`
(RenderLimits), `profile` (TemplateProfile: the one home of a template's facts), `locality` (windowed
rendering where it is exact), `iteration_reuse` and `scan_reuse` (renders that keep an earlier render's loop
iterations and resume its scans; `loop_select` runs only the iterations asked for), `check` (check_template). Imports `text/tokenizer/` and L0.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "ChatTemplate": "ctxkit.text.template.chat_template",
    "load_template": "ctxkit.text.template.chat_template",
    "RenderLimits": "ctxkit.text.template.limits",
    "template_profile": "ctxkit.text.template.profile",
    "check_template": "ctxkit.text.template.check",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
