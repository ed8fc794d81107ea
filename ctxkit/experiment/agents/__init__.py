"""Agents of the A/B harness: scripted, `transformers` and OpenAI-compatible HTTP policies."""
