"""How many torch threads an embedding model call runs with (`encode_threads`), and a block that sets them.

Shared by the contextual embedder (`ctxkit.context.embeddings.encode_texts`) and the static embedder's table
build (`ctxkit.context.static_embedder.build_table`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from ctxkit.errors import ConfigError

ENCODE_THREADS_ENV = "CTXKIT_EMBED_THREADS"
"""Environment variable overriding `DEFAULT_ENCODE_THREADS` (a positive integer; 0: torch's own setting)."""
DEFAULT_ENCODE_THREADS = 1
"""Torch intra-op threads for a model call of `encode_texts`. A run's calls are small (one to a few dozen
texts of at most 256 tokens), and on a busy machine a second OpenMP thread waits for a core more than it
helps: on the shared 2-core box, 1 thread encoded the quickstart's texts 3.5x faster than torch's default
of 2. Equal settings give equal bytes; across settings a row agrees to float tolerance, and on some CPUs
(an AVX-512/AMX Xeon here) its last bits change with the thread count, since the reductions split
differently: a run that must reproduce another's retrieval bit for bit keeps this setting (checked in tests)."""


def encode_threads() -> int | None:
    """The intra-op threads `encode_texts` runs the model with: `$CTXKIT_EMBED_THREADS` when set (0 or
    empty: None, torch's own setting), else `DEFAULT_ENCODE_THREADS`; `ConfigError` for anything else."""
    raw = os.environ.get(ENCODE_THREADS_ENV)
    if raw is None:
        return DEFAULT_ENCODE_THREADS
    raw = raw.strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{ENCODE_THREADS_ENV}={raw!r}: expected a positive integer, or 0 for torch's own setting")
    return n or None


@contextlib.contextmanager
def torch_threads(torch: Any, n: int | None) -> Iterator[None]:
    """Run a block with `n` torch intra-op threads (None: unchanged); the previous setting is restored after."""
    before = torch.get_num_threads()
    change = n is not None and n != before
    if change:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(before)
