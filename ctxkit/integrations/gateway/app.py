"""The gateway over HTTP: a Starlette app served by uvicorn.

Why these: Starlette is a small, well-kept ASGI toolkit (no request models to fight: the gateway checks
bodies itself, to answer OpenAI-shaped errors), uvicorn its usual server; `llama-cpp-python[server]`
already brings both. Both are imported only here, inside functions, so `import ctxkit` stays fast.

Routes: `POST /v1/chat/completions` (JSON or, with `stream: true`, server-sent events), `GET /v1/models`,
`POST /ctxkit/episodes/{id}/end`, `GET /ctxkit/episodes`. A body over `max_body_bytes` is answered 413
before it is read whole; at most `max_concurrent` requests run at once (the rest wait their turn); every
error is OpenAI's `{"error": {...}}` with the status of its `GatewayError` (500 for anything unforeseen,
never a traceback). Every answer of a chat request carries the `X-Ctxkit-Episode` header.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Any, Iterator

from ctxkit.errors import GatewayError
from ctxkit.integrations.gateway.gateway import Gateway
from ctxkit.integrations.gateway.wire import (EPISODE_HEADER, check_episode_id, error_body, parse_chat_request,
                                              parse_end_request, stream_events)

__all__ = ["make_app", "serve", "serving", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Default largest request body (bytes): 413 above it."""


def make_app(gateway: Gateway, *, max_body_bytes: int = MAX_BODY_BYTES, max_concurrent: int = 8,
             reap_every_s: float = 5.0) -> Any:
    """The Starlette app of `gateway` (see the module docstring); idle episodes are reaped every `reap_every_s`."""
    import anyio  # lazy: the HTTP stack loads only when a gateway is served
    from starlette.applications import Starlette  # lazy: as above
    from starlette.requests import Request  # lazy: as above
    from starlette.responses import JSONResponse, StreamingResponse  # lazy: as above
    from starlette.routing import Route  # lazy: as above

    limiter = anyio.CapacityLimiter(max_concurrent)

    def failure(exc: Exception) -> JSONResponse:
        if isinstance(exc, GatewayError):
            return JSONResponse(error_body(str(exc), status=exc.status, param=exc.param, code=exc.code),
                                status_code=exc.status)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", status=500), status_code=500)

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise GatewayError(f"request body of {declared} bytes is over the limit of {max_body_bytes}", status=413,
                               code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise GatewayError(f"request body is over the limit of {max_body_bytes} bytes", status=413,
                                   code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def chat(request: Request):
        try:
            parsed = parse_chat_request(await read_body(request), header_episode=request.headers.get(EPISODE_HEADER))
            answer = await anyio.to_thread.run_sync(gateway.chat, parsed, limiter=limiter)
        except Exception as exc:  # every failure is an OpenAI error answer, never a traceback
            return failure(exc)
        headers = {EPISODE_HEADER: answer["ctxkit"]["episode_id"]}
        if parsed.stream:
            return StreamingResponse(stream_events(answer), media_type="text/event-stream", headers=headers)
        return JSONResponse(answer, headers=headers)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": gateway.engine.model, "object": "model", "created": 0,
                                                         "owned_by": "ctxkit-gateway"}]})

    async def end(request: Request):
        try:
            episode_id = check_episode_id(request.path_params["episode_id"], "path")
            fields = parse_end_request(await read_body(request))
            return JSONResponse(await anyio.to_thread.run_sync(gateway.end, episode_id, fields))
        except Exception as exc:
            return failure(exc)

    async def episodes(request: Request):
        return JSONResponse(gateway.episodes())

    async def reaper() -> None:
        while True:
            await anyio.sleep(reap_every_s)
            await anyio.to_thread.run_sync(gateway.reap_idle)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reaper)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
        await anyio.to_thread.run_sync(gateway.close)

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
              Route("/ctxkit/episodes/{episode_id}/end", end, methods=["POST"]),
              Route("/ctxkit/episodes", episodes, methods=["GET"])]
    async def no_route(request: Request, exc: Exception):
        status = getattr(exc, "status_code", 404)
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}",
                                       status=status), status_code=status)

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: no_route, 405: no_route})


def _server(app: Any, host: str, port: int) -> Any:
    import uvicorn  # lazy: the HTTP server loads only when a gateway is served

    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                         timeout_graceful_shutdown=30))


def serve(app: Any, *, host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve `app` until interrupted; open episodes end `truncated`/`gateway_shutdown`. Ctrl-C and SIGTERM stop
    it alike: uvicorn shuts down gracefully, then re-raises the signal, which ends here as `KeyboardInterrupt`
    (so the caller's cleanup, e.g. stopping the engine it started, runs)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupt) if main else None
    try:
        _server(app, host, port).run()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def serving(app: Any, *, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Serve `app` in a background thread; yields its base URL (`http://host:port`). On exit the server stops
    and the gateway's open episodes end as in `serve`."""
    from ctxkit.experiment.engine_server import free_port  # lazy: only when serving

    server = _server(app, host, port or free_port(host))
    thread = threading.Thread(target=server.run, name="ctxkit-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise GatewayError(f"the gateway did not start on {host}:{server.config.port}", status=500)
        time.sleep(0.02)
    try:
        yield f"http://{host}:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
