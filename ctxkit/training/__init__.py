"""Training: episodes into faithful samples, replay and resume from the log, the pre-flight audit, sample
files, and the RL arithmetic over them.

Modules: `episode_samples` (samples, TrainingSample), `sample_files` (Parquet/JSONL), `context_replay`
(replay, resume, verify_log), `offline_steps`, `preflight` and `preflight_resume` (audit), `rl_math`,
`rl_masks`, `reference_step` (a framework-free policy-gradient step), `mismatch/`. Imports `context/` and
below.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "samples": "ctxkit.training.episode_samples",
    "compressed_samples": "ctxkit.training.episode_samples",
    "TrainingSample": "ctxkit.training.episode_samples",
    "replay": "ctxkit.training.context_replay",
    "replay_steps": "ctxkit.training.context_replay",
    "resume": "ctxkit.training.context_replay",
    "verify_log": "ctxkit.training.context_replay",
    "add_offline_steps": "ctxkit.training.offline_steps",
    "audit": "ctxkit.training.preflight",
    "write_samples": "ctxkit.training.sample_files",
    "read_samples": "ctxkit.training.sample_files",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
