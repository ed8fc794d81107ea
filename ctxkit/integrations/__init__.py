"""Glue between ctxkit samples and training frameworks. `ctxkit.integrations.trl`: TRL's GRPO
rollout function and SFT dataset adapter; `ctxkit.integrations.verl`: a verl 0.9 agent loop (verl imported only when
its class is looked up). Nothing here is imported by `import ctxkit`."""
