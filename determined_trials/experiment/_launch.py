"""What a trial process is started with: its command, environment and cluster-info file."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from determined_trials._info import CLUSTER_INFO_ENV, ClusterInfo, TrialInfo
from determined_trials.config import CONFIG_WARNED_ENV
from determined_trials.core.store import SPAWNED_AT_ENV
from determined_trials.launch import entrypoint_command

__all__ = ["CONFIG_ENV", "LATEST_CHECKPOINT_ENV", "RUN_DIR_ENV", "TrialLaunch", "trial_command", "trial_environment"]

CONFIG_ENV = "DET_EXPERIMENT_CONFIG"
LATEST_CHECKPOINT_ENV = "DET_LATEST_CHECKPOINT"
RUN_DIR_ENV = "DET_RUN_DIR"
_SHELL_SYNTAX = re.compile(r"[;&|<>$`*?(){}\[\]~!#\n\\'\"]")
# Variables of an enclosing launch that must not leak into a trial process.
_DROPPED_ENV = ("DET_LAUNCH_DIR", "DET_CORE_PORT", "DET_JOB_ID", "DET_CHIEF_IP", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "USE_TORCH_DISTRIBUTED")


@dataclasses.dataclass(frozen=True)
class TrialLaunch:
    """One start of a trial process."""

    experiment_id: int
    trial_id: int
    hparams: dict[str, Any]
    seed: int
    config: dict[str, Any]
    length: int
    latest_checkpoint: str | None
    steps_completed: int
    run_id: int
    warm_start_checkpoint: str | None = None

    def cluster_info(self, run_dir: Path) -> ClusterInfo:
        """The ClusterInfo the process reads through ``DET_CLUSTER_INFO``."""
        trial = TrialInfo(
            trial_id=self.trial_id, experiment_id=self.experiment_id, trial_seed=self.seed,
            hparams=self.hparams, config=self.config, steps_completed=self.steps_completed,
            trial_run_id=self.run_id, debug=bool(self.config.get("debug", False)),
        )
        return ClusterInfo(
            trial=trial, run_dir=str(run_dir), latest_checkpoint=self.latest_checkpoint,
            task_id=f"{self.experiment_id}.{self.trial_id}", allocation_id=f"{self.trial_id}.{self.run_id}",
            searcher_lengths=[self.length], warm_start_checkpoint=self.warm_start_checkpoint,
        )


def trial_command(entrypoint: str | list[str] | tuple[str, ...]) -> list[str]:
    """The command for the config's entrypoint; a plain command line runs without a shell in between,
    so that a stop signal reaches the trial itself."""
    cmd = entrypoint_command(entrypoint if isinstance(entrypoint, str) else list(entrypoint))
    if cmd[:2] == ["sh", "-c"] and not _SHELL_SYNTAX.search(cmd[2]):
        words = shlex.split(cmd[2])
        if words and "=" not in words[0]:  # `VAR=value cmd` needs the shell
            return words
    return cmd


def trial_environment(
    launch: TrialLaunch, *, run_dir: Path, info_path: Path, config_path: Path, extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The trial process's environment: ours plus where its cluster info, config and run folder are."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    launch.cluster_info(run_dir).write(info_path)
    env[CLUSTER_INFO_ENV] = str(info_path)
    env[CONFIG_ENV] = str(config_path)
    env[RUN_DIR_ENV] = str(run_dir)
    env.pop(LATEST_CHECKPOINT_ENV, None)
    if launch.latest_checkpoint:
        env[LATEST_CHECKPOINT_ENV] = launch.latest_checkpoint
    env["PYTHONUNBUFFERED"] = "1"
    env[CONFIG_WARNED_ENV] = "1"  # the runner showed the config's warnings once: not again in every trial
    # One job id per trial process: every rank it starts, however wrapped, finds its peers by it.
    env["DET_JOB_ID"] = f"trial-{launch.experiment_id}.{launch.trial_id}.{launch.run_id}-{uuid.uuid4().hex[:12]}"
    # `python3 train.py` in an entrypoint means the interpreter that runs det-trials.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env[SPAWNED_AT_ENV] = repr(time.time())  # the trial's `start` time part begins here
    env.update(extra or {})
    return env
