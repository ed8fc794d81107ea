"""`ctxkit view`: one self-contained HTML page showing what the policy saw.

Episodes (timeline, each step's exact context coloured by provenance, budget, sampled tokens with
log-probs, timings), compactions (before/after side by side) and run folders (the report's arms x tasks
grid, plots, a side-by-side diff of two arms' contexts), all from the logs through the replay code.
`build_page(paths)` builds it, `write_page` writes it, `serve_page` serves it on 127.0.0.1. See
docs/VIEWER.md.
"""

from __future__ import annotations

from ctxkit.viewer.page import HOST, Page, build_page, serve_page, write_page

__all__ = ["HOST", "Page", "build_page", "serve_page", "write_page"]
