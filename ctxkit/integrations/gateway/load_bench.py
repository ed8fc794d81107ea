"""Gateway overhead under load: the same chat requests sent to the engine directly and through the gateway.

`python -m ctxkit.integrations.gateway.load_bench --clients 16 --requests 50` (SmolLM2's tokenizer from
`$CTXKIT_SHARED` or `--tokenizer`) starts llama.cpp's server
(SmolLM2-135M GGUF) and a gateway in front of it (keep-all, chatml-tools-v1 over SmolLM2's tokenizer), then
runs `clients` threads, each sending `requests` chat requests in conversations of `turns` turns (the history
re-sent each time, as a harness does), alternating rounds of `round_size` requests per client between the two
routes so both see the same machine: `direct` (the engine's own `/v1/chat/completions`) and `gateway`
(recorded, one episode per conversation, ended after its last turn). It checks that nothing was lost (a step
recorded per gateway request) and that every log replays (`verify_log`), and prints p50/p90/p99/max client
latency per route, the gateway's own recording time per request from the logs (`ingest_s + build_s` of each
step: the log append with its fsync, the context build) and its engine call (`generate_s`: the completion
alone; the llama.cpp dialect also asks `/extras/tokenize` first), and the machine's load (`ctxkit.benchmarks.machine_load.LoadMeter`), as text and as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ctxkit.benchmarks.machine_load import LoadMeter
from ctxkit.events import Step
from ctxkit.experiment.engine_server import LlamaServer, LlamaServerSpec
from ctxkit.integrations.gateway.app import make_app, serving
from ctxkit.integrations.gateway.gateway import EngineSpec, Gateway, GatewayConfig
from ctxkit.log.event_log import read_events
from ctxkit.training.context_replay import verify_log

__all__ = ["run_bench", "percentiles", "main"]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p90, p99 and max of `values` (seconds), rounded to 0.1 ms."""
    a = np.asarray(values, dtype=float)
    return {"n": int(a.size), **{k: round(float(np.percentile(a, q)), 4) for k, q in (("p50", 50), ("p90", 90), ("p99", 99))},
            "max": round(float(a.max()), 4)}


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


class _Client:
    """One harness: conversations of `turns` turns, on either route."""

    def __init__(self, k: int, turns: int, max_tokens: int):
        self.k, self.turns, self.max_tokens = k, turns, max_tokens
        self.conversation = {"direct": 0, "gateway": 0}
        self.messages: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
        self.latency: dict[str, list[float]] = {"direct": [], "gateway": []}

    def request(self, route: str, url: str, engine_url: str) -> None:
        msgs = self.messages[route]
        n = len(self.latency[route]) % self.turns
        if n == 0:
            self.conversation[route] += 1
            msgs[:] = [{"role": "system", "content": "You are terse."}]  # no template adds its default one
        msgs.append({"role": "user", "content": f"Client {self.k}, turn {n}: name a colour."})
        episode = f"bench-{self.k}-{self.conversation[route]}"
        body = {"model": "m", "messages": msgs, "max_tokens": self.max_tokens, "temperature": 0.0}
        t0 = time.perf_counter()
        if route == "direct":
            answer = _post(f"{engine_url}/v1/chat/completions", body)
        else:
            answer = _post(f"{url}/v1/chat/completions", body, {"X-Ctxkit-Episode": episode})
        self.latency[route].append(time.perf_counter() - t0)
        message = answer["choices"][0]["message"]
        msgs.append({"role": "assistant", "content": message.get("content") or ""})
        if route == "gateway" and n == self.turns - 1:
            _post(f"{url}/ctxkit/episodes/{episode}/end", {})


def _rounds(people: Sequence[_Client], requests: int, round_size: int, url: str, engine_url: str) -> None:
    """Alternate rounds of `round_size` requests per client between the two routes until `requests` are sent."""
    done = 0
    while done < requests:
        size = min(round_size, requests - done)
        for route in ("direct", "gateway"):
            threads = [threading.Thread(target=lambda c=c: [c.request(route, url, engine_url) for _ in range(size)])
                       for c in people]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        done += size


def run_bench(tokenizer: str, *, clients: int = 16, requests: int = 50, turns: int = 5, round_size: int = 10, max_tokens: int = 4,
              server_threads: int = 2, max_concurrent: int = 8, out_dir: Path | None = None) -> dict[str, Any]:
    """Run the benchmark (see the module docstring); the figures as a dict."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="ctxkit-gateway-bench-"))
    with LlamaServer(LlamaServerSpec(n_ctx=2048, n_threads=server_threads)) as server:
        engine = EngineSpec(server.base_url, server.model, "llama-cpp", timeout_s=600.0)
        config = GatewayConfig(out_dir=out, tokenizer=tokenizer, template="chatml-tools-v1", budget=2048,
                               detect_pins=False, max_tokens=max_tokens, max_episodes=clients * 2)
        gateway = Gateway(config, engine)
        people = [_Client(k, turns, max_tokens) for k in range(clients)]
        with serving(make_app(gateway, max_concurrent=max_concurrent)) as url:
            warm = _Client(-1, 1, max_tokens)  # first requests load the model and caches: not timed
            for _ in range(3):
                warm.request("direct", url, server.base_url)
                warm.request("gateway", url, server.base_url)
            with LoadMeter() as load:
                _rounds(people, requests, round_size, url, server.base_url)
    logs = [read_events(p) for p in sorted(out.glob("bench-[0-9]*.jsonl"))]
    steps = [e for events in logs for e in events if isinstance(e, Step)]
    replayed = sum(r.n_ok == r.n_steps for r in map(verify_log, logs))
    own = [s.timings["ingest_s"] + s.timings["build_s"] for s in steps]
    figures = {route: percentiles([x for c in people for x in c.latency[route]]) for route in ("direct", "gateway")}
    figures["gateway_recording"] = percentiles(own)
    figures["gateway_engine_call"] = percentiles([s.timings["generate_s"] for s in steps])
    figures["overhead"] = {k: round(figures["gateway"][k] - figures["direct"][k], 4) for k in ("p50", "p90", "p99")}
    figures["setup"] = {"clients": clients, "requests_per_client": requests, "turns": turns, "max_tokens": max_tokens,
                        "server_threads": server_threads, "max_concurrent": max_concurrent, "steps_recorded": len(steps),
                        "gateway_requests": sum(len(c.latency["gateway"]) for c in people), "episodes": len(logs),
                        "logs_replayed": replayed,
                        "wall_s": round(load.wall, 1), "load": str(load), "logs": str(out)}
    return figures


def main(argv: list[str] | None = None) -> int:
    """Command line of the benchmark; prints a table and the JSON figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = os.environ.get("CTXKIT_SHARED")
    p.add_argument("--tokenizer", required=not shared,
                   default=str(Path(shared or ".") / "tokenizers" / "smollm2-135m-instruct"),
                   help="SmolLM2's tokenizer folder (default: $CTXKIT_SHARED/tokenizers/smollm2-135m-instruct)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=50, help="requests per client")
    p.add_argument("--turns", type=int, default=5, help="turns per conversation (episode)")
    p.add_argument("--round-size", type=int, default=10, help="requests per client before switching route")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--max-concurrent", type=int, default=8)
    args = p.parse_args(argv)
    figures = run_bench(args.tokenizer, clients=args.clients, requests=args.requests, turns=args.turns, round_size=args.round_size,
                        max_tokens=args.max_tokens, server_threads=args.server_threads, max_concurrent=args.max_concurrent)
    for key in ("direct", "gateway", "gateway_recording", "gateway_engine_call"):
        f = figures[key]
        print(f"{key:<20} n={f['n']:<5} p50={f['p50'] * 1000:8.1f} ms  p90={f['p90'] * 1000:8.1f} ms  "
              f"p99={f['p99'] * 1000:8.1f} ms  max={f['max'] * 1000:8.1f} ms")
    o = figures["overhead"]
    print(f"overhead (gateway - direct): p50 {o['p50'] * 1000:.1f} ms, p90 {o['p90'] * 1000:.1f} ms, "
          f"p99 {o['p99'] * 1000:.1f} ms; {figures['setup']['load']}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
