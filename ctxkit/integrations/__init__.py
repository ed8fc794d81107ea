"""Glue between ctxkit samples and training frameworks. `ctxkit.integrations.trl`: TRL's GRPO
rollout function and SFT dataset adapter. Nothing here is imported by `import ctxkit`."""
