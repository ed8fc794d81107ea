"""`ctxkit serve`: an OpenAI-compatible recording gateway between an agent harness and an inference engine.

A harness that speaks text-in/text-out chat completions (and re-sends its whole history on every call)
points its base URL at the gateway; each request's episode is found, its new messages are appended to
the episode's log, any change the harness made to its earlier history is recorded as a harness
compaction, the context is built by ctxkit (or the history passed through, `record_only`), the engine
samples, and the `Step` is recorded token-exact before the answer goes back.

Modules: `history` (fingerprints, a rewrite as compaction edits), `episode` (one episode's log, builder and
history), `gateway` (`Gateway`: requests to steps, no HTTP), `wire` (the OpenAI request and answer
shapes), `app` (Starlette + uvicorn), `load_bench` (gateway overhead against the engine alone).
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "Gateway": "ctxkit.integrations.gateway.gateway",
    "GatewayConfig": "ctxkit.integrations.gateway.gateway",
    "EngineSpec": "ctxkit.integrations.gateway.gateway",
    "make_app": "ctxkit.integrations.gateway.app",
    "serving": "ctxkit.integrations.gateway.app",
    "HARNESS_COMPRESSOR": "ctxkit.integrations.gateway.episode",
    "EPISODE_HEADER": "ctxkit.integrations.gateway.wire",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
