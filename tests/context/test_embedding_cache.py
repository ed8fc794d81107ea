"""The embedding cache: content-hash keys, append-only files that tolerate torn and corrupt records and
concurrent writers, batch-independent vectors, and runs whose results do not depend on the cache."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from conftest import require_module, tokenizer_dir
from ctxkit.context import embedding_cache as ec
from ctxkit.context.embedding_cache import (VectorCache, clear_vector_caches, encode_stats, parse_records, record_bytes,
                                    run_cache_dir, using_cache_dir, vector_key)


def unit(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.fixture(autouse=True)
def fresh_caches():
    clear_vector_caches()
    yield
    clear_vector_caches()


def test_key_is_sha256_of_model_id_nul_text():
    import hashlib

    assert vector_key("m@sha256:ab", "hi") == hashlib.sha256(b"m@sha256:ab\0hi").digest()
    assert vector_key("m1", "hi") != vector_key("m2", "hi")
    assert ec.model_folder_name("all-MiniLM-L6-v2@sha256:0123") == "all-MiniLM-L6-v2-sha256-0123"


def test_records_round_trip_and_a_torn_tail_is_left_for_later():
    recs = [(vector_key("m", f"t{i}"), unit(i)) for i in range(3)]
    data = b"".join(record_bytes(k, v) for k, v in recs)
    size = len(data) // 3
    got, used, corrupt = parse_records(data)
    assert used == len(data) and not corrupt
    assert [k for k, _ in got] == [k for k, _ in recs]
    assert all(g.tobytes() == v.tobytes() for (_, g), (_, v) in zip(got, recs))
    for cut in (1, 3, 4, 20, size - 1):
        got, used, corrupt = parse_records(data[: size + cut])
        assert (len(got), used, corrupt) == (1, size, False)


def test_a_corrupt_record_ends_its_file_and_is_never_trusted():
    recs = [(vector_key("m", f"t{i}"), unit(i)) for i in range(3)]
    data = bytearray(b"".join(record_bytes(k, v) for k, v in recs))
    size = len(data) // 3
    data[size + 50] ^= 0x01  # a flipped bit inside the second vector
    got, used, corrupt = parse_records(bytes(data))
    assert (len(got), used, corrupt) == (1, size, True)
    garbage = b"XXXX" + bytes(60)
    assert parse_records(garbage) == ([], 0, True)
    not_unit = record_bytes(vector_key("m", "x"), np.full(8, 0.5, dtype=np.float32))
    assert parse_records(not_unit) == ([], 0, True)


def test_vectors_written_by_one_cache_are_read_by_another(tmp_path):
    folder = tmp_path / "m"
    a, b = VectorCache("m", folder), VectorCache("m", folder)
    k1, k2 = vector_key("m", "one"), vector_key("m", "two")
    a.put_many({k1: unit(1)})
    assert b.get_many([k1, k2]).keys() == {k1}
    a.put_many({k2: unit(2)})
    assert b.get_many([k2])[k2].tobytes() == unit(2).tobytes()  # appended later: read on the next miss
    files = sorted(folder.glob("*.vec"))
    assert len(files) == 1
    # a torn record at the end of a file and a corrupt file are both ignored
    (folder / "torn.vec").write_bytes(record_bytes(vector_key("m", "three"), unit(3))[:-5])
    bad = bytearray(record_bytes(vector_key("m", "four"), unit(4)))
    bad[-1] ^= 0xFF
    (folder / "bad.vec").write_bytes(bytes(bad))
    c = VectorCache("m", folder)
    keys = [k1, k2, vector_key("m", "three"), vector_key("m", "four")]
    assert c.get_many(keys).keys() == {k1, k2}
    a.close()


def _writer(folder: str, start: int) -> None:
    cache = VectorCache("m", Path(folder))
    for i in range(start, start + 200):
        cache.put_many({vector_key("m", f"t{i}"): unit(i)})
    cache.close()


def test_concurrent_writers_lose_nothing(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path / "m"), s)) for s in (0, 100, 200)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    got = VectorCache("m", tmp_path / "m").get_many(vector_key("m", f"t{i}") for i in range(400))
    assert len(got) == 400
    assert all(got[vector_key("m", f"t{i}")].tobytes() == unit(i).tobytes() for i in range(400))
    assert len(list((tmp_path / "m").glob("*.vec"))) == 3


# ------------------------------------------------------------------------------------------ real model


@pytest.fixture(scope="module")
def minilm():
    require_module("sentence_transformers")
    require_module("faiss")
    from ctxkit.context.models import load_embedder

    return load_embedder()


TEXTS = ["ok", "fine", "also short", "The quick brown fox jumps over the lazy dog near the river bank.", "x = 1\nprint(x)",
         "error: file not found " * 12, "a much longer text about parsers, buffers and offsets " * 20, ""]


def test_a_vector_does_not_depend_on_its_batch(minilm):
    from ctxkit.context.embeddings import encode_texts

    together = encode_texts(minilm, TEXTS)
    alone = np.stack([encode_texts(minilm, [t])[0] for t in TEXTS])
    reordered = encode_texts(minilm, TEXTS[::-1] + TEXTS[:2])[: len(TEXTS)][::-1]
    assert together.dtype == np.float32 and together.shape == (len(TEXTS), 384)
    assert together.tobytes() == alone.tobytes() == reordered.tobytes()
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # and they are the model's vectors (to float tolerance)
    plain = minilm.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    assert np.allclose(together, plain, atol=1e-5)


def test_encode_threads_setting(monkeypatch):
    from ctxkit.context import encode_threads
    from ctxkit.errors import ConfigError

    monkeypatch.delenv(encode_threads.ENCODE_THREADS_ENV, raising=False)
    assert encode_threads.encode_threads() == encode_threads.DEFAULT_ENCODE_THREADS == 1
    for raw, want in (("3", 3), (" 2 ", 2), ("0", None), ("", None)):
        monkeypatch.setenv(encode_threads.ENCODE_THREADS_ENV, raw)
        assert encode_threads.encode_threads() == want
    for raw in ("-1", "two", "1.5"):
        monkeypatch.setenv(encode_threads.ENCODE_THREADS_ENV, raw)
        with pytest.raises(ConfigError, match="CTXKIT_EMBED_THREADS"):
            encode_threads.encode_threads()


def test_a_vector_is_stable_per_thread_setting_close_across_them_and_torch_is_left_as_it_was(minilm, monkeypatch):
    import torch

    from ctxkit.context.embeddings import encode_texts
    from ctxkit.context.encode_threads import ENCODE_THREADS_ENV

    before = torch.get_num_threads()
    got = {}
    for raw in ("1", "2", "0", "1"):
        monkeypatch.setenv(ENCODE_THREADS_ENV, raw)
        got.setdefault(raw, []).append(encode_texts(minilm, TEXTS))
        assert torch.get_num_threads() == before
    # one setting, one set of bytes; across settings the last bits may differ with the CPU's reduction
    # order (they do on an AVX-512/AMX Xeon), never more than float tolerance
    assert got["1"][0].tobytes() == got["1"][1].tobytes()
    for raw in ("2", "0"):
        assert np.allclose(got[raw][0], got["1"][0], rtol=0, atol=1e-6)


def test_model_loads_are_recorded_once_per_process(minilm):
    from ctxkit.context.models import default_embedder_path, load_embedder, model_load_seconds, model_loads

    loads = [m for m in model_loads() if m.kind == "embedder" and m.path == str(default_embedder_path().resolve())]
    assert len(loads) == 1 and loads[0].device == "cpu" and loads[0].seconds > 0
    assert model_load_seconds() == pytest.approx(sum(m.seconds for m in model_loads()))
    n = len(model_loads())
    assert load_embedder() is minilm
    assert len(model_loads()) == n  # a cached model is not loaded (nor recorded) again


def test_text_embedder_uses_the_disk_cache_and_a_warm_cache_never_encodes(minilm, tmp_path):
    from ctxkit.context.embeddings import TextEmbedder

    with using_cache_dir(tmp_path / "cache"):
        cold = TextEmbedder().encode(TEXTS)
        assert encode_stats() == {"texts_encoded": len(TEXTS), "encode_calls": 1}
    clear_vector_caches()
    with using_cache_dir(tmp_path / "cache"):
        warm = TextEmbedder().encode(TEXTS[::-1])
        assert encode_stats() == {"texts_encoded": 0, "encode_calls": 0}
    assert warm[::-1].tobytes() == cold.tobytes()
    assert ec.cache_dir() is None
    clear_vector_caches()
    assert TextEmbedder().encode(TEXTS).tobytes() == cold.tobytes()  # no cache at all: the same bytes


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(f"""
name = "embcache"
tokenizer = "{tokenizer_dir('qwen2.5-instruct')}"
seeds = [0]
budget = 1400
baseline = "retrieve"
[limits]
max_steps = 14
max_context = 1400
wall_time_s = 300.0
[agents.scripted]
[tasks.needle-recall]
n_files = 6
lines_per_file = 8
[[arms]]
name = "summarize"
compressor = "summarize"
params = {{ summarizer = "extractive", keep_first = 1, keep_last = 2, max_summary_tokens = 120 }}
[[arms]]
name = "retrieve"
compressor = "retrieve"
params = {{ keep_first = 1, keep_last = 2, top_k = 2 }}
[report]
bootstrap_resamples = 50
""")
    return path


def _logs(out: Path) -> dict[str, list[tuple[str, str]]]:
    from ctxkit.log.event_log import read_events

    return {p.relative_to(out).as_posix(): [(e.id, e.kind) for e in read_events(p)]
            for p in sorted((out / "episodes").rglob("*.jsonl"))}


def test_a_run_with_a_warm_cache_records_what_a_cold_run_recorded(minilm, tmp_path):
    import shutil

    from ctxkit.events import Compaction
    from ctxkit.experiment.config import load_config
    from ctxkit.experiment.runner import read_rows, run_experiment
    from ctxkit.training.context_replay import verify_log
    from ctxkit.log.event_log import read_events

    config = load_config(_config(tmp_path))
    cold = tmp_path / "cold"
    run_experiment(config, cold, progress=False, report=False)
    cold_encoded = encode_stats()["texts_encoded"]
    assert cold_encoded > 0
    cache_files = sorted(run_cache_dir(cold).rglob("*.vec"))
    assert cache_files, "the run wrote no embedding cache"
    logs = _logs(cold)
    kinds = [k for events in logs.values() for _, k in events]
    assert "compaction" in kinds
    retrieved = [e for p in (cold / "episodes" / "retrieve").glob("*.jsonl") for e in read_events(p)
                 if isinstance(e, Compaction) and e.details.get("retrieved")]
    assert retrieved, "the retrieve arm retrieved nothing"

    # warm: a fresh process state (memory cleared) with the cold run's cache in the run folder
    clear_vector_caches()
    warm = tmp_path / "warm"
    run_cache_dir(warm).parent.mkdir(parents=True)
    shutil.copytree(run_cache_dir(cold), run_cache_dir(warm))
    run_experiment(config, warm, progress=False, report=False)
    assert encode_stats()["texts_encoded"] == 0
    assert _logs(warm) == logs

    # cold again (empty memory, empty run cache): every vector computed again, the same event ids
    clear_vector_caches()
    again = tmp_path / "again"
    run_experiment(config, again, progress=False, report=False)
    assert encode_stats()["texts_encoded"] == cold_encoded
    assert _logs(again) == logs
    strip = lambda rows: sorted(({k: v for k, v in r.items() if k != "timing"} for r in rows), key=lambda r: r["episode_id"])
    assert strip(read_rows(warm)) == strip(read_rows(cold)) == strip(read_rows(again))

    # replay never embeds
    clear_vector_caches()
    for rel in logs:
        result = verify_log(cold / rel)
        assert result.ok and result.n_ok == result.n_steps > 0, rel
    assert encode_stats() == {"texts_encoded": 0, "encode_calls": 0}


def test_build_all_steps_shares_the_cache_across_invocations(minilm, tmp_path, capsys):
    from ctxkit.cli.parser import main
    from ctxkit.events import EpisodeStart, Message, ToolCall, ToolResult
    from ctxkit.log.event_log import EventLog

    log = EventLog.create(tmp_path / "ep.jsonl", durability="none")
    log.extend([EpisodeStart(episode_id="ep-cache"), Message(role="system", content="You are a careful agent."),
                Message(role="user", content="Find the vault access code in the logs.")])
    for t in range(8):
        call = ToolCall(id=f"c{t}", name="read_file", arguments=f'{{"path": "logs/{t}.txt"}}')
        body = " ".join(f"Parser {t * 7 + i} filled buffer {i} at offset {t}." for i in range(12))
        if t == 2:
            body += " The vault access code is 4417-ZEBRA."
        log.extend([Message(role="assistant", content=f"Reading log {t}.", tool_calls=(call,)),
                    ToolResult(tool_call_id=f"c{t}", name="read_file", content=body)])
    log.close()
    args = ["build", str(tmp_path / "ep.jsonl"), "--tokenizer", str(tokenizer_dir("qwen2.5-instruct")), "--budget", "700",
            "--all-steps", "--json", "--embedding-cache", str(tmp_path / "cache")]
    outputs = []
    for compressor in ("retrieve", "summarize"):
        for _ in range(2):
            clear_vector_caches()
            assert main(args + ["--compressor", compressor]) == 0
            outputs.append((capsys.readouterr().out, encode_stats()["texts_encoded"]))
    (r_cold, r_cold_n), (r_warm, r_warm_n), (s_cold, s_cold_n), (s_warm, s_warm_n) = outputs
    assert r_cold_n > 0 and r_warm_n == 0 and r_warm == r_cold and '"retrieved"' in r_cold
    assert s_cold_n > 0 and s_warm_n == 0 and s_warm == s_cold and '"summary"' in s_cold
    ec.set_cache_dir(None)  # the CLI set this process's cache root for its run
