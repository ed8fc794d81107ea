"""One self-contained HTML page from episode logs or a run folder, written to a file or served.

`build_page(paths)` reads each path (an episode log, a folder of logs, or a run folder from `ctxkit
ablate`), gathers the data (`episode_data`, `run_data`) and returns a `Page`: the HTML text with the
page's CSS and JavaScript inline (package data files `page.html`, `viewer.css`, `viewer.js`) and the data
as one JSON blob (`embed_json`: valid JSON whose text holds no `<`, `>` or `&`, so no message text can end
or change the <script> it sits in). The page loads nothing from anywhere (no network, no CDN; plots are
data URIs) and renders a step's tokens only when the step is opened. A log that cannot be read (torn or
non-JSON line, broken hash chain: any `CtxkitError` while reading it) is shown as a failed episode with
its error, the others as usual; only when every episode fails does `build_page` raise (the first error).
`write_page` writes it atomically, with the mode the umask gives a new file; `serve_page` serves it on
127.0.0.1 only.
"""

from __future__ import annotations

import html
import os
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

import orjson

from ctxkit.errors import ConfigError, CtxkitError
from ctxkit.viewer.episode_data import CLASS_CODES, Pool, episode_data, failed_episode
from ctxkit.viewer.run_data import is_run_folder, run_data
from ctxkit.training.preflight import find_logs

__all__ = ["Page", "build_page", "embed_json", "write_page", "serve_page", "HOST"]

HOST = "127.0.0.1"
"""The only address `serve_page` listens on."""

_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})
"""Characters that only ever occur inside JSON strings, written as JSON's own `\\u` escapes instead."""


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
    failed: tuple[str, ...] = ()
    """The load error of each episode whose log could not be read (`"<ErrorType>: <path>:<line>: ..."`);
    those episodes are on the page, shown as failed, and counted in `n_episodes`."""

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


def embed_json(data: Any) -> str:
    """`data` as JSON text that is safe as the whole content of a `<script type="application/json">`:
    `<`, `>`, `&`, U+2028 and U+2029 are written as `\\u` escapes, so the text holds no `</script`,
    `<!--` or `<script` (nothing the HTML parser acts on) and `JSON.parse` of it gives `data` back."""
    return orjson.dumps(data).decode("utf-8").translate(_SCRIPT_SAFE)


def _episodes(logs: Sequence[tuple[str, Path]], pool: Pool, tokenizer: Any, template: Any) -> list[dict[str, Any]]:
    """The data of each log; a log that cannot be read becomes a failed episode, unless all of them fail
    (then the first error is raised)."""
    episodes, errors = [], []
    for label, path in logs:
        try:
            episodes.append(episode_data(path, pool, tokenizer=tokenizer, template=template, label=label))
        except CtxkitError as exc:
            episodes.append(failed_episode(path, exc, label=label))
            errors.append(exc)
    if errors and len(errors) == len(episodes):
        raise errors[0]
    return episodes


def build_page(paths: Iterable[str | Path], *, tokenizer: Any = None, template: Any = None,
               title: str | None = None) -> Page:
    """The page of `paths` (logs, folders of logs, run folders; see the module docstring)."""
    paths = list(paths)
    if not paths:
        raise ConfigError("build_page: no paths given; expected episode logs or a run folder")
    logs, runs = _collect(paths)
    pool = Pool()
    episodes = _episodes(logs, pool, tokenizer, template)
    data = {"episodes": episodes, "runs": runs, "segments": pool.segments, "strings": pool.strings, "messages": pool.messages,
            "codes": {v: k for k, v in CLASS_CODES.items()}}
    blob = embed_json(data)
    title = title or ("ctxkit view: " + ", ".join(str(p) for p in paths))
    head, rest = _asset("page.html").split("__DATA__")
    head = head.replace("/*__CSS__*/", _asset("viewer.css")).replace("__TITLE__", html.escape(title))
    rest = rest.replace("/*__JS__*/", _asset("viewer.js").replace("</script", "<\\/script"))
    page = head + blob + rest  # the data goes in last, so no text inside it is ever replaced
    n_shown = sum(s["context"]["n"] for e in episodes for s in e["steps"] if "context" in s)
    return Page(html=page, n_episodes=len(episodes), n_steps=sum(len(e["steps"]) for e in episodes),
                n_segments=len(pool.segments), n_tokens_stored=sum(len(s["ids"]) for s in pool.segments),
                n_tokens_shown=n_shown, failed=tuple(e["load_error"] for e in episodes if e["load_error"]))


def write_page(page: Page, output: str | Path) -> Path:
    """Write `page` to `output` (through a new temporary file in the same folder, then renamed). The file
    gets the mode any new file gets, `0o666 & ~umask`, like `open(output, "w")`."""
    out = Path(output)
    if out.is_dir():
        raise ConfigError(f"-o {out}: is a folder; expected an .html file path")
    if not out.parent.is_dir():
        raise ConfigError(f"-o {out}: folder {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as f:  # "x": a new file, created 0o666 less the umask
            f.write(page.html.encode("utf-8"))
        os.replace(tmp, out)
    except OSError as exc:
        raise ConfigError(f"-o {out}: cannot write: {exc.strerror or type(exc).__name__}") from None
    finally:
        tmp.unlink(missing_ok=True)
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
