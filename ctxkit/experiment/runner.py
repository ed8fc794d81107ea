"""The A/B runner: validate a config, run the paired grid on local processes or Ray, resume, report.

`run_experiment(config, out_dir, executor="local"|"ray", workers=N, address=None)`:

0. Before anything is written: `out_dir` must be a folder or creatable as one, and a Ray `address` must
   take a TCP connection within `RAY_CONNECT_TIMEOUT_S` (`check_ray_address`), else a `ConfigError`.
1. `validate(config)` before any episode: every task is built and given a throwaway episode, every agent
   class is found and its parameters checked, every server the run starts can start here (llama-cpp-python
   installed, its GGUF file present: `engine_server.check_servable`), every compressor is built, the tokenizer and template load,
   and each arm's opening context (with its pins) is built for each task: a budget too small for the pinned
   prefix, or an opening context over `max_context`, is a `ConfigError` naming the arm, task and file.
2. Lock: the run folder is locked for the whole run (`run_folder.RunLock`, an OS lock dropped when the
   process dies), so a second run on the same folder is refused and no episode gets two rows.
3. Resume: `OUT/run.json` records the config fingerprint (a different config in the same folder is refused).
   A row of `OUT/results.jsonl` is kept when its episode log verifies (`ctxkit.log.verify`) and ends with an
   `EpisodeEnd`; every other episode of the grid is run from scratch, after its partial log (if any) is
   renamed to `<log>.aborted-<n>` (kept for inspection, never read again). Resuming never calls
   `replay.resume`: an episode is short, and a clean rerun gives a row identical to an uninterrupted run.
   Repeated rows of one episode and a torn last line are dropped from `results.jsonl` here.
4. Each finished episode's row is appended to `results.jsonl` and fsynced, in completion order (readers sort
   by arm, task, seed). Progress shows on stderr with rich.
5. The report (`report.md`, plots) is written from `results.jsonl`.

An agent table with `server = "llama-cpp"` gets a llama.cpp server on 127.0.0.1 started before the first
episode runs and stopped after the last (`engine_server.serve_agents`); the config fingerprint is that of
the config as written (the server's port is not part of it), so a resumed run starts a fresh server.

Ctrl-C (SIGINT), or SIGTERM, raises `RunInterrupted` (a `KeyboardInterrupt` carrying how many finished episodes are kept):
local workers ignore SIGINT and are stopped by the parent, queued Ray tasks are cancelled, the lock is
released, and a rerun resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from ctxkit.errors import BudgetError, ConfigError, CtxkitError
from ctxkit.experiment.config import EpisodeSpec, ExperimentConfig
from ctxkit.experiment.engine_server import check_servable, serve_agents
from ctxkit.experiment.episode import arm_builder, log_path, run_episode
from ctxkit.experiment.run_folder import RESULTS, RUN_INFO, append_row, check_out_dir, open_run_folder, read_rows, read_run_info
from ctxkit.context.compress import make_compressor
from ctxkit.events import EpisodeStart, message_from_openai
from ctxkit.experiment.agents.base import agent_class
from ctxkit.experiment.tasks.base import make_task
from ctxkit.log.event_log import EventLog, read_events, verify
from ctxkit.text.tokenizer.loader import load_tokenizer

__all__ = ["validate", "run_experiment", "RunSummary", "RunInterrupted", "read_rows", "EXECUTORS", "config_fingerprint",
           "check_ray_address"]

EXECUTORS: tuple[str, ...] = ("local", "ray")
"""Accepted `executor` values."""

RAY_CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a TCP connection to a Ray `address` before calling it unreachable."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped `run_experiment`; `kept` finished episodes are in `results.jsonl`, and a rerun
    into the same folder resumes. A `KeyboardInterrupt`, so code that does not know it still stops."""

    def __init__(self, out_dir: str, kept: int):
        super().__init__(f"interrupted; {kept} finished episode{'s' if kept != 1 else ''} kept in {out_dir}, rerun to resume")
        self.out_dir = out_dir
        """The run folder."""
        self.kept = kept
        """Finished episodes with a row in `results.jsonl`."""


@dataclass(frozen=True)
class RunSummary:
    """What a run did."""

    out_dir: str
    """The run folder."""
    total: int
    """Episodes in the grid."""
    reused: int
    """Finished episodes found and kept (resume)."""
    ran: int
    """Episodes run now."""
    aborted_logs: tuple[str, ...]
    """Partial logs renamed aside."""
    report: str | None
    """Path of `report.md`."""


def config_fingerprint(config: ExperimentConfig) -> str:
    """sha256 of everything in the config that changes rows (the path and report settings excluded)."""
    data = dataclasses.asdict(config)
    data.pop("path")
    data.pop("report")
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def validate(config: ExperimentConfig) -> None:
    """Check everything the grid needs before any episode runs (see the module docstring)."""
    path = config.path
    try:
        tokenizer = load_tokenizer(config.tokenizer)
    except CtxkitError as exc:
        raise ConfigError(f"{path}: tokenizer {config.tokenizer!r} cannot be loaded: {exc}") from None
    tasks = {t.name: make_task(t.name, t.params, where=path) for t in config.tasks}
    for ac in config.agents:
        try:
            cls = agent_class(ac.kind)
            if hasattr(cls, "check_params"):
                cls.check_params(dict(ac.params))
            if hasattr(cls, "check_task"):
                for name in tasks:
                    cls.check_task(name)
        except ConfigError as exc:
            raise ConfigError(f"{path}: [agents.{ac.label}]: {exc}") from None
    check_servable(config)
    for arm in config.arms:
        try:
            make_compressor(arm.compressor, **dict(arm.params))
        except ConfigError as exc:
            raise ConfigError(f"{path}: arm {arm.name!r}: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="ctxkit-validate-") as tmp:
        for arm in config.arms:
            try:
                builder = arm_builder(config, arm, tokenizer)
            except CtxkitError as exc:
                raise ConfigError(f"{path}: arm {arm.name!r}: {exc}") from None
            for name, task in tasks.items():
                where = Path(tmp) / f"{arm.name}-{name}"
                where.mkdir()
                episode = task.episode(config.seeds[0], where)
                log = EventLog.create(where / "log.jsonl", durability="none")
                try:
                    log.append(EpisodeStart(episode_id="validate", tools=episode.tools, context=builder.describe()))
                    log.extend([message_from_openai(m) for m in episode.messages])
                    try:
                        ctx = builder.build(log)
                    except BudgetError as exc:
                        raise ConfigError(
                            f"{path}: arm {arm.name!r}, task {name!r}: budget {arm.budget} is too small for the "
                            f"opening context and its pinned constraints: {exc}"
                        ) from None
                finally:
                    log.close()
                if ctx.n_tokens > config.limits.max_context:
                    raise ConfigError(
                        f"{path}: arm {arm.name!r}, task {name!r}: the opening context is {ctx.n_tokens} tokens, over "
                        f"[limits] max_context = {config.limits.max_context}"
                    )


# ---------------------------------------------------------------------------------------------- results


def _log_finished(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        if not verify(path).ok:
            return False
        events = read_events(path)
    except CtxkitError:
        return False
    return bool(events) and events[-1].kind == "episode_end"


def _set_aside(path: Path) -> list[str]:
    moved = []
    n = 1
    while Path(f"{path}.aborted-{n}").exists():
        n += 1
    for p in (path, Path(f"{path}.blobs")):
        if p.exists():
            target = Path(f"{p}.aborted-{n}")
            os.replace(p, target)
            moved.append(str(target))
    Path(f"{path}.lock").unlink(missing_ok=True)
    return moved


def _prepare(config: ExperimentConfig, out: Path) -> tuple[list[EpisodeSpec], int, list[str]]:
    """Check the (locked) run folder, keep finished rows, set partial logs aside; returns (todo, reused, aborted)."""
    info_path = out / RUN_INFO
    fp = config_fingerprint(config)
    info = read_run_info(out)
    if info is not None:
        if info.get("fingerprint") != fp:
            raise ConfigError(
                f"{out} holds a run of another config ({info.get('config')}, fingerprint "
                f"{str(info.get('fingerprint'))[:12]}); use another --out folder"
            )
    original = read_rows(out, resume=True)  # foreign rows refused before anything is written; torn tail dropped
    info = {"config": config.path, "fingerprint": fp, "experiment": dataclasses.asdict(config)}
    tmp = info_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True, default=str))
    os.replace(tmp, info_path)
    grid = config.episodes()
    keys = {s.key for s in grid}
    kept: dict[str, dict[str, Any]] = {}
    for row in original:
        key = row["episode_id"]
        log = row.get("log")
        if key in keys and key not in kept and isinstance(log, str) and _log_finished(out / log):
            kept[key] = row
    results = out / RESULTS
    clean = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept.values()).encode()
    if results.exists() and results.read_bytes() != clean:  # dropped rows, duplicates, a torn last line
        tmp = out / (RESULTS + ".tmp")
        tmp.write_bytes(clean)
        os.replace(tmp, results)
    todo = [s for s in grid if s.key not in kept]
    aborted: list[str] = []
    for spec in todo:
        aborted += _set_aside(log_path(out, spec))
    return todo, len(kept), aborted


# ---------------------------------------------------------------------------------------------- executors


def _init_worker(threads: int) -> None:
    """Pool worker initializer: Ctrl-C is the parent's to handle (it stops the workers), so no worker traceback;
    and the worker's share of the cores for torch (embeddings, local models), unless OMP_NUM_THREADS is set:
    N workers each running one thread per core oversubscribe the machine many times over."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # read when torch is first imported in the worker


def _run_local(config: ExperimentConfig, todo: list[EpisodeSpec], out: Path, workers: int,
               done: Callable[[dict[str, Any]], None]) -> None:
    if workers <= 1:
        for spec in todo:
            done(run_episode(config, spec, out))
        return
    before = set(multiprocessing.active_children())
    threads = max(1, (os.cpu_count() or 1) // workers)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(threads,))
    try:
        pending = {pool.submit(run_episode, config, spec, out) for spec in todo}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                done(fut.result())
    except KeyboardInterrupt:
        # stop the episodes in flight now: their partial logs are set aside by the next run
        for proc in set(multiprocessing.active_children()) - before:
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def check_ray_address(address: str | None, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Fail fast (`ConfigError`) when `address` (`host:port` or `ray://host:port`) takes no TCP connection within
    `timeout_s`: `ray.init` would otherwise retry for a long time. `None`, `auto` and `local` are not checked."""
    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"Ray address {address!r}: expected host:port, ray://host:port, 'auto' or 'local'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(
            f"Ray address {address!r}: no Ray cluster reachable there ({reason}); start one with `ray start --head`, "
            "or leave out the address to start a local Ray"
        ) from None


@contextlib.contextmanager
def _ray_session(workers: int, address: str | None) -> Iterator[None]:
    """Connect to (or start) Ray for the run, and shut it down after when this call started it."""
    check_ray_address(address)
    try:
        import ray  # lazy: ray loads on first use
    except ImportError:
        raise ConfigError("executor 'ray' needs Ray: pip install 'ctxkit[ray]'") from None
    started = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise ConfigError(f"Ray address {address or '(local)'!r}: cannot start or join Ray: {exc}") from None
        started = True
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _run_ray(config: ExperimentConfig, todo: list[EpisodeSpec], out: Path, done: Callable[[dict[str, Any]], None]) -> None:
    import ray  # lazy: ray loads on first use

    remote = ray.remote(num_cpus=1)(run_episode)
    pending = [remote.remote(config, spec, str(out)) for spec in todo]
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                done(ray.get(ref))
    except BaseException:
        for ref in pending:  # stop what is still queued or running (on a remote cluster too)
            ray.cancel(ref, force=True)
        raise


def run_experiment(
    config: ExperimentConfig,
    out_dir: str | Path,
    *,
    executor: str = "local",
    workers: int = 1,
    address: str | None = None,
    progress: bool = True,
    report: bool = True,
) -> RunSummary:
    """Validate, lock the run folder, resume, run the remaining grid, write the report (module docstring).

    Errors before any episode runs (config, `out_dir` not a writable folder, folder in use by another run,
    Ray unreachable) are `ConfigError`s and leave nothing behind. Ctrl-C raises `RunInterrupted` (finished
    rows kept; episodes in flight stopped, their partial logs set aside by the next run)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor {executor!r}; expected one of {list(EXECUTORS)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers is {workers!r}; expected an integer >= 1")
    out = check_out_dir(out_dir)
    if executor == "ray":
        check_ray_address(address)
    validate(config)
    session = _ray_session(workers, address) if executor == "ray" else contextlib.nullcontext()
    with session, open_run_folder(out), _terminate_as_interrupt():
        todo, reused, aborted = _prepare(config, out)
        written = {s.key for s in config.episodes()} - {s.key for s in todo}
        total = len(config.episodes())
        report_path = None
        try:
            with _progress(progress, total, reused, config.name) as advance:
                def done(row: dict[str, Any]) -> None:
                    if row["episode_id"] in written:  # never two rows for one episode (e.g. a retried task)
                        return
                    append_row(out, row)
                    written.add(row["episode_id"])
                    advance(row)

                if todo:
                    with serve_agents(config) as served:  # engines ctxkit starts (server = "llama-cpp"), stopped after
                        if executor == "ray":
                            _run_ray(served, todo, out, done)
                        else:
                            _run_local(served, todo, out, workers, done)
            if report:
                from ctxkit.experiment.report import write_report  # lazy: pulls numpy

                report_path = str(write_report(out))
        except KeyboardInterrupt:
            # count what is on disk: the signal may land between a row's append and its bookkeeping
            raise RunInterrupted(str(out), len(read_rows(out, resume=True))) from None
    return RunSummary(str(out), total, reused, len(todo), tuple(aborted), report_path)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While the grid runs in the main thread, SIGTERM (`kill`, a job scheduler) stops it as Ctrl-C does:
    the workers are stopped with it and the lock released. Python's default would end this process alone and
    leave the pool's workers running their episodes into the folder."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _progress:
    """A rich progress bar over the grid (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int, completed: int, name: str):
        self.enabled, self.total, self.completed, self.name = enabled, total, completed, name
        self._progress = None

    def __enter__(self) -> Callable[[dict[str, Any]], None]:
        if not self.enabled:
            return lambda row: None
        from rich.console import Console  # lazy: rich loads on first use
        # lazy: rich loads on first use
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                                  console=Console(stderr=True))
        self._progress.start()
        task = self._progress.add_task(f"ablate {self.name}", total=self.total, completed=self.completed, last="")

        def advance(row: dict[str, Any]) -> None:
            self._progress.update(task, advance=1, last=f"{row['episode_id']}: {row['cause']}")

        return advance

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def rows_by_key(rows: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Rows keyed by episode id (for comparing runs regardless of completion order)."""
    return {r["episode_id"]: r for r in rows}
