"""`ctxkit serve`: the OpenAI-compatible recording gateway (thin; the logic is `ctxkit.integrations.gateway`)."""

from __future__ import annotations

import argparse
import sys

from ctxkit.cli.commands.argtypes import add_render_options, non_negative_int, positive_int


def register_serve(subparsers) -> None:
    """Add `ctxkit serve --out DIR --tokenizer T (--engine llama-cpp | --engine-url URL --engine-model M) ...`."""
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible gateway recording a harness's chat completions as token-exact episodes",
        description="Serve POST /v1/chat/completions and GET /v1/models in front of an engine, recording each "
                    "episode to DIR/<episode>.jsonl: new messages as events, harness-side history rewrites as "
                    "compactions, every sampled step token-exact. End an episode with POST "
                    "/ctxkit/episodes/<id>/end {\"outcome\", \"reward\"}; idle ones end truncated.")
    p.add_argument("--out", required=True, metavar="DIR", help="folder of the episode logs (created)")
    add_render_options(p, purpose="build with", required=True)
    engine = p.add_mutually_exclusive_group(required=True)
    engine.add_argument("--engine", choices=("llama-cpp",), help="start llama.cpp's server (default: SmolLM2 GGUF)")
    engine.add_argument("--engine-url", metavar="URL", help="an OpenAI-compatible engine already running")
    p.add_argument("--engine-model", metavar="NAME", help="served model name (with --engine-url)")
    p.add_argument("--dialect", choices=("vllm", "llama-cpp"), default="vllm",
                   help="with --engine-url: vllm (token ids to /v1/completions) or llama-cpp (text, checked)")
    p.add_argument("--server-model", metavar="GGUF", help="with --engine llama-cpp: the GGUF file to serve")
    p.add_argument("--n-ctx", type=positive_int, default=4096, help="with --engine llama-cpp: context window (4096)")
    p.add_argument("--record-only", action="store_true",
                   help="pass the harness's history through untouched (keep-all, no pins)")
    p.add_argument("--compressor", default="keep-all", help="registered compressor (see `ctxkit compressors`)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="compressor parameter (JSON value)")
    p.add_argument("--budget", type=positive_int, default=None, help="token budget (default: --n-ctx)")
    p.add_argument("--reserve-tokens", type=non_negative_int, default=0, help="tokens of the budget kept for the answer")
    p.add_argument("--no-detect-pins", action="store_true", help="turn off the constraint detector")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="tokens per turn when a request says none")
    p.add_argument("--idle-timeout", type=positive_int, default=600, metavar="S",
                   help="end an episode idle for S seconds as truncated (600)")
    p.add_argument("--max-episodes", type=positive_int, default=64, help="open episodes at most (429 beyond)")
    p.add_argument("--max-concurrent", type=positive_int, default=8, help="requests served at once (others wait)")
    p.add_argument("--engine-timeout", type=positive_int, default=120, metavar="S", help="seconds per engine answer")
    p.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
    p.add_argument("--port", type=non_negative_int, default=8100, help="listen port (8100)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import contextlib  # lazy: per command: keeps `ctxkit --help` fast
    from pathlib import Path  # lazy: per command: keeps `ctxkit --help` fast

    from ctxkit.cli.commands.build_cmd import parse_params  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.experiment.engine_server import LlamaServer, LlamaServerSpec
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.integrations.gateway.app import make_app, serve
    from ctxkit.integrations.gateway.gateway import EngineSpec, Gateway, GatewayConfig  # lazy: per command

    if args.engine_url and not args.engine_model:
        raise ConfigError("serve: --engine-url needs --engine-model (the served model name)")
    config = GatewayConfig(out_dir=Path(args.out), tokenizer=args.tokenizer, template=args.template,
                           record_only=args.record_only, compressor=args.compressor, params=parse_params(args.param),
                           budget=args.budget or args.n_ctx, reserve_tokens=args.reserve_tokens,
                           detect_pins=not args.no_detect_pins, max_tokens=args.max_tokens,
                           idle_timeout_s=float(args.idle_timeout), max_episodes=args.max_episodes)
    with contextlib.ExitStack() as stack:
        if args.engine:
            server = stack.enter_context(LlamaServer(LlamaServerSpec(model_path=args.server_model, n_ctx=args.n_ctx)))
            engine = EngineSpec(server.base_url, server.model, "llama-cpp", float(args.engine_timeout))
        else:
            engine = EngineSpec(args.engine_url, args.engine_model, args.dialect, float(args.engine_timeout))
        gateway = Gateway(config, engine)
        print(f"ctxkit serve: http://{args.host}:{args.port}/v1 -> {engine.base_url} ({engine.model}, {engine.dialect}); "
              f"logs in {args.out}", file=sys.stderr, flush=True)
        serve(make_app(gateway, max_concurrent=args.max_concurrent), host=args.host, port=args.port)
    return 0
