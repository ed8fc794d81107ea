"""Input checked at the edges (issue 23): one overwrite rule for every output (`--force`), file names that are
not UTF-8, logs with nothing to build from, builder parameters of the wrong shape."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import tokenizer_dir
from rollout_driver import Driver
from ctxkit.cli.parser import main
from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import ConfigError
from ctxkit.log.event_log import EventLog, read_events

CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture(scope="module")
def log_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("first-contact")
    builder = ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor="keep-all", budget=2000)
    log = EventLog.create(root / "ep.jsonl", episode_id="ep-first")
    Driver(n_turns=2, episode_id="ep-first").run(log, builder)
    log.close()
    return root / "ep.jsonl"


def _conversation(tmp_path: Path) -> Path:
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(CONVERSATION))
    return path


def _refused(capsys, option: str, path: Path) -> None:
    err = capsys.readouterr().err
    assert f"ctxkit: error: {option} {path}: already exists; pass --force to replace it" in err, err


# ---------------------------------------------------------------------------------------------- overwrite rule


def test_samples_refuses_an_existing_output_unless_forced(log_path, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    out.write_text("keep me\n")
    assert main(["samples", str(log_path), "-o", str(out)]) == 2
    _refused(capsys, "-o", out)
    assert out.read_text() == "keep me\n"
    assert main(["samples", str(log_path), "-o", str(out), "--force"]) == 0
    assert out.read_text() != "keep me\n" and "samples from 1 log(s)" in capsys.readouterr().out


def test_samples_refuses_before_any_work(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    out.write_text("")
    # the log does not exist: the output is refused first, before the logs are looked for
    assert main(["samples", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2
    _refused(capsys, "-o", out)


def test_import_o_refuses_an_existing_log_unless_forced(tmp_path, capsys):
    src = _conversation(tmp_path)
    out = tmp_path / "ep.jsonl"
    assert main(["import", str(src), "-o", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["import", str(src), "-o", str(out), "--episode-id", "again"]) == 2
    _refused(capsys, "-o", out)
    assert out.read_bytes() == before
    assert main(["import", str(src), "-o", str(out), "--episode-id", "again", "--force"]) == 0
    assert EventLog.open(out).episode_id == "again"


def test_import_out_dir_refuses_existing_logs_unless_forced(tmp_path, capsys):
    src = _conversation(tmp_path)
    out = tmp_path / "logs"
    assert main(["import", str(src), "--out-dir", str(out)]) == 0
    (target,) = out.iterdir()
    before = target.read_bytes()
    capsys.readouterr()
    assert main(["import", str(src), "--out-dir", str(out)]) == 2
    _refused(capsys, "--out-dir:", target)
    assert target.read_bytes() == before
    assert main(["import", str(src), "--out-dir", str(out), "--force"]) == 0
    assert len(read_events(target)) == len(read_events(target)) and target.read_bytes() != before


def test_mismatch_refuses_existing_outputs_before_loading_anything(tmp_path, capsys):
    for option, name in (("--json", "m.json"), ("--plot", "m.png")):
        out = tmp_path / name
        out.write_text("")
        # the log does not exist and the model is not loadable: the output is refused first
        assert main(["mismatch", str(tmp_path / "missing.jsonl"), "--model", "nope", option, str(out)]) == 2
        _refused(capsys, option, out)


def test_view_refuses_an_existing_page_unless_forced(log_path, tmp_path, capsys):
    out = tmp_path / "v.html"
    out.write_text("keep me")
    assert main(["view", str(log_path), "-o", str(out)]) == 2
    _refused(capsys, "-o", out)
    assert out.read_text() == "keep me"
    assert main(["view", str(log_path), "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html") or "<html" in out.read_text()


def test_view_serve_exits_130_on_ctrl_c(log_path, monkeypatch, capsys):
    import ctxkit.viewer

    class Interrupted:
        server_address = ("127.0.0.1", 1)

        def serve_forever(self):
            raise KeyboardInterrupt

        def server_close(self):
            pass

    monkeypatch.setattr(ctxkit.viewer, "serve_page", lambda page, port: Interrupted())
    assert main(["view", str(log_path), "--serve"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_every_writing_command_has_force():
    from ctxkit.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for name in ("samples", "import", "mismatch", "view"):
        assert "--force" in sub[name]._option_string_actions, name


# ---------------------------------------------------------------------------------------------- file names


def test_import_of_a_file_whose_name_is_not_utf8(tmp_path, capsys):
    src = Path(os.fsdecode(bytes(tmp_path) + b"/conv\xff.json"))
    src.write_text(json.dumps(CONVERSATION))
    out = Path(os.fsdecode(bytes(tmp_path) + b"/out\xfe.jsonl"))
    assert main(["import", str(src), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "out\\xfe.jsonl" in printed
    start = read_events(out)[0]
    assert start.metadata["import"]["path"].endswith("conv\\xff.json")  # recorded as UTF-8 text, the byte kept


def test_log_header_metadata_that_is_not_utf8_names_the_field(tmp_path):
    bad = os.fsdecode(b"name\xff.json")
    with pytest.raises(ConfigError, match=r"log header: metadata\.source\.path is not UTF-8 text \('name\\udcff\.json'\)"):
        EventLog.create(tmp_path / "ep.jsonl", metadata={"source": {"path": bad}})
    assert not (tmp_path / "ep.jsonl").exists()


# ---------------------------------------------------------------------------------------------- empty logs


def test_build_of_a_log_without_messages_is_a_log_format_error(tmp_path, capsys):
    path = tmp_path / "hdr.jsonl"
    EventLog.create(path, episode_id="x").close()
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    for extra in ([], ["--write"]):
        assert main(["build", str(path), "--tokenizer", tok, "--budget", "100", *extra]) == 2
        err = capsys.readouterr().err
        assert f"ctxkit: error: {path}: the log holds no messages to build a context from" in err, err
        assert "element 0" not in err


@pytest.mark.parametrize("argv", [
    ["export", "{p}"], ["replay", "{p}", "--verify"], ["samples", "{p}", "-o", "{d}/s.jsonl"], ["build", "{p}",
    "--tokenizer", "TOK", "--budget", "100"]])
def test_an_empty_log_file_is_named_by_every_command(tmp_path, capsys, argv):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    args = [a.format(p=path, d=tmp_path).replace("TOK", tok) for a in argv]
    assert main(args) == 2
    assert f"ctxkit: error: {path}:1: empty log: no header line" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- builder params


@pytest.mark.parametrize("params", [["keep_last", 2], [("keep_last", 2)], "keep_last=2", 3])
def test_builder_params_must_be_a_mapping(params):
    with pytest.raises(ConfigError, match=r"ContextBuilder: params is a (list|str|int) .*expected a mapping of compressor"):
        ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor="window", params=params)
