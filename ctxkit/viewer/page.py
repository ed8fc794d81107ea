"""One self-contained HTML page from episode logs or a run folder, written to a file or served.

`build_page(paths)` reads each path (an episode log, a folder of logs, or a run folder from `ctxkit
ablate`), gathers the data (`episode_data`, `run_data`) and returns a `Page`: the HTML text with the
page's CSS and JavaScript inline (package data files `page.html`, `viewer.css`, `viewer.js`) and the data
as one JSON blob. The page loads nothing from anywhere (no network, no CDN; plots are data URIs) and
renders a step's tokens only when the step is opened. `write_page` writes it atomically; `serve_page`
serves it on 127.0.0.1 only.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence
import os
import tempfile

import orjson

from ctxkit.errors import ConfigError
from ctxkit.viewer.episode_data import CLASS_CODES, Pool, episode_data
from ctxkit.viewer.run_data import is_run_folder, run_data
from ctxkit.training.preflight import find_logs

__all__ = ["Page", "build_page", "write_page", "serve_page", "HOST"]

HOST = "127.0.0.1"
"""The only address `serve_page` listens on."""


@dataclass(frozen=True)
class Page:
    """A built viewer page."""

    html: str
    """The whole page."""
    n_episodes: int
    """Episodes on the page."""
    n_steps: int
    """Steps over all episodes."""
    n_segments: int
    """Distinct token segments stored (each once)."""
    n_tokens_stored: int
    """Tokens stored in those segments."""
    n_tokens_shown: int
    """Tokens over every step's context (what the page shows when every step is opened)."""

    @property
    def size(self) -> int:
        """Size of the page in bytes (UTF-8)."""
        return len(self.html.encode("utf-8"))


def _asset(name: str) -> str:
    return resources.files("ctxkit.viewer").joinpath(name).read_text(encoding="utf-8")


def _collect(paths: Sequence[str | Path]) -> tuple[list[tuple[str, Path]], list[dict[str, Any]]]:
    """`(episode logs with their labels, run folder data)`."""
    logs: list[tuple[str, Path]] = []
    runs: list[dict[str, Any]] = []
    for p in paths:
        p = Path(p)
        if is_run_folder(p):
            data, eps = run_data(p)
            runs.append(data)
            logs += eps
        else:
            found, skipped = find_logs([p])
            if not found:
                extra = f" ({len(skipped)} .jsonl file(s) that are not ctxkit logs)" if skipped else ""
                raise ConfigError(f"{p}: no episode logs found{extra}; expected a log, a folder of logs or a run folder")
            logs += [(str(f), f) for f in found]
    return logs, runs


def build_page(paths: Iterable[str | Path], *, tokenizer: Any = None, template: Any = None,
               title: str | None = None) -> Page:
    """The page of `paths` (logs, folders of logs, run folders; see the module docstring)."""
    paths = list(paths)
    if not paths:
        raise ConfigError("build_page: no paths given; expected episode logs or a run folder")
    logs, runs = _collect(paths)
    pool = Pool()
    episodes = [episode_data(path, pool, tokenizer=tokenizer, template=template, label=label) for label, path in logs]
    data = {"episodes": episodes, "runs": runs, "segments": pool.segments, "strings": pool.strings, "messages": pool.messages,
            "codes": {v: k for k, v in CLASS_CODES.items()}}
    blob = orjson.dumps(data).decode("utf-8").replace("</", "<\\/").replace("<!--", "<\\!--")
    title = title or ("ctxkit view: " + ", ".join(str(p) for p in paths))
    head, rest = _asset("page.html").split("__DATA__")
    head = head.replace("/*__CSS__*/", _asset("viewer.css")).replace("__TITLE__", html.escape(title))
    rest = rest.replace("/*__JS__*/", _asset("viewer.js").replace("</script", "<\\/script"))
    page = head + blob + rest  # the data goes in last, so no text inside it is ever replaced
    n_shown = sum(s["context"]["n"] for e in episodes for s in e["steps"] if "context" in s)
    return Page(html=page, n_episodes=len(episodes), n_steps=sum(len(e["steps"]) for e in episodes),
                n_segments=len(pool.segments), n_tokens_stored=sum(len(s["ids"]) for s in pool.segments),
                n_tokens_shown=n_shown)


def write_page(page: Page, output: str | Path) -> Path:
    """Write `page` to `output` (through a temporary file in the same folder, then renamed)."""
    out = Path(output)
    if out.is_dir():
        raise ConfigError(f"-o {out}: is a folder; expected an .html file path")
    if not out.parent.is_dir():
        raise ConfigError(f"-o {out}: folder {out.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(page.html.encode("utf-8"))
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


class _Handler(BaseHTTPRequestHandler):
    body: bytes = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        """The page at `/` and `/index.html`; 404 elsewhere."""
        if self.path.split("?")[0] not in ("/", "/index.html"):
            self.send_error(404, "only / is served")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return


def serve_page(page: Page, port: int = 0, *, background: bool = False) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0: a free port; `server.server_address[1]` says which) serving
    `page` at `/`. With `background=True` it runs in a daemon thread (stop it with `shutdown()` and
    `server_close()`); else the caller runs `serve_forever()`."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port {port!r}: expected a port number in [0, 65535]")
    handler = type("PageHandler", (_Handler,), {"body": page.html.encode("utf-8")})
    try:
        server = ThreadingHTTPServer((HOST, port), handler)
    except OSError as exc:
        raise ConfigError(f"--port {port}: cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None
    if background:
        threading.Thread(target=server.serve_forever, name="ctxkit-view", daemon=True).start()
    return server
