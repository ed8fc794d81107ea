#!/usr/bin/env python3
"""Time the README's install commands on a fresh clone with an empty pip cache, and the load they ran under.

    python scripts/install_timing.py                  # bash scripts/quickstart.sh in a fresh clone of HEAD
    python scripts/install_timing.py --what test      # the install part of bash scripts/test.sh (compiles llama.cpp)
    python scripts/install_timing.py --readme README.md   # also write the figure between its timing markers

The clone is of the committed HEAD (uncommitted changes are not in it), in a temporary folder with the shared
fixtures linked beside it (`$CTXKIT_SHARED`, else `../shared`), and pip runs with `PIP_NO_CACHE_DIR=1`, so
every wheel comes from the package registries and anything compiled is compiled again. `quickstart` runs the
whole script (install, then the quickstart ablation); `test` runs `scripts/test.sh --collect-only -q` (the
install and the tests' collection, not the tests). The line printed is the README's sentence, with the wall
time, the install's share of it, the venv's size, the 1-minute load average while it ran and the date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ctxkit.benchmarks.machine_load import LoadMeter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from readme_figures import apply, duration  # noqa: E402  (a sibling script, not a package module)

COMMANDS = {"quickstart": ["bash", "scripts/quickstart.sh", "--no-progress"],
            "test": ["bash", "scripts/test.sh", "--collect-only", "-q"]}
"""What each measurement runs in the clone."""
MARKERS = {"quickstart": "quickstart-install", "test": "test-install"}
"""The README timing marker each measurement writes."""


def fresh_clone(root: Path) -> Path:
    """A clone of HEAD at `root/ctxkit`, with `root/shared` linking to the shared fixtures."""
    shared = Path(os.environ.get("CTXKIT_SHARED") or REPO.parent / "shared").resolve()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(root / "ctxkit")], check=True)
    (root / "shared").symlink_to(shared, target_is_directory=True)
    return root / "ctxkit"


def clean_env() -> dict[str, str]:
    """This environment without an active venv, with an empty pip cache, offline for the hubs."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CTXKIT_SHARED")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(PIP_NO_CACHE_DIR="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure(what: str) -> str:
    """Run the measurement `what` in a fresh clone; the README sentence for it."""
    with tempfile.TemporaryDirectory(prefix="ctxkit-install-") as tmp:
        clone = fresh_clone(Path(tmp))
        with LoadMeter() as load:
            proc = subprocess.run(COMMANDS[what], cwd=clone, env=clean_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(COMMANDS[what])} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
        installed = (clone / ".venv" / "bin" / "ctxkit").stat().st_mtime - load.t0_epoch
        size = folder_bytes(clone / ".venv") / 1e9
    when = datetime.date.today().isoformat()
    if what == "quickstart":
        m = re.search(r"(\d+) episodes: (\d+) run", proc.stdout)
        episodes = f", {m.group(1)} episodes" if m else ""
        return (f"`bash scripts/quickstart.sh` took {duration(load.wall)} in all (install {duration(installed)}, "
                f"nothing compiled; then the ablation{episodes}) and left a {size:.1f} GB venv: a fresh clone, "
                f"empty pip cache, {load}, {when}")
    return (f"the install of `bash scripts/test.sh` took {duration(load.wall)} (llama-cpp-python compiled from "
            f"source) and left a {size:.1f} GB venv: a fresh clone, empty pip cache, {load}, {when}")


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", choices=sorted(COMMANDS), default="quickstart", help="which install to time")
    ap.add_argument("--readme", type=Path, help="write the sentence between this file's timing marker")
    args = ap.parse_args(argv)
    sentence = measure(args.what)
    print(sentence)
    if args.readme is not None:
        text = args.readme.read_text(encoding="utf-8")
        marker = MARKERS[args.what]
        if f"<!-- timing:{marker} -->" not in text:
            print(f"{args.readme}: no <!-- timing:{marker} --> marker", file=sys.stderr)
            return 2
        args.readme.write_text(apply(text, {}, {marker: sentence}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
