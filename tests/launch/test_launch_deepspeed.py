"""A DeepSpeedTrial through the launchers with real processes: ``launch.deepspeed`` (DeepSpeed's own
launcher) preempted by SIGTERM on a ZeRO-1 run with gradient accumulation, then resumed from that
2-rank checkpoint on 2 ranks; ``launch.torch_distributed --trial`` with a rank that fails. Every run
asserts that no process of the job is left behind."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.helpers_launch import Launch, assert_nothing_left, launches_fixture  # noqa: F401 (the launches fixture)
from support.helpers_paths import SUPPORT
from trials_deepspeed import make_model, plain_loop

import determined_trials as det

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

LENGTH = 12
TRIAL = '''
import json
import time

from trials_deepspeed import DSTrial, weights


class LaunchedTrial(DSTrial):
    def train_batch(self, dataloader_iter, epoch_idx, batch_idx):
        metrics = super().train_batch(dataloader_iter, epoch_idx, batch_idx)
        hp, rank = self.context.get_hparams(), self.context.distributed.get_rank()
        if self.calls % hp["gas"]:
            return metrics  # not the batch's last micro-batch
        print(f"rank {rank} trained batch {batch_idx}", flush=True)
        if rank == hp.get("fail_rank") and batch_idx == hp.get("fail_at"):
            raise RuntimeError(f"boom in batch {batch_idx}")
        if batch_idx == hp["length"] - 1 and rank == 0:
            with open("weights.json", "w") as out:
                json.dump(weights(self.engine), out)
        time.sleep(hp["sleep"])
        return metrics
'''


def _config(folder: Path, name: str, slots: int = 2, batches: int = LENGTH, **hparams: object) -> Path:
    hp = {"global_batch_size": 16, "stage": 1, "micro": 4, "gas": 2, "sleep": 0.0, "length": LENGTH, **hparams}
    path = folder / name
    path.write_text(textwrap.dedent(f"""
        hyperparameters: {json.dumps(hp)}
        searcher: {{name: single, metric: val_loss, max_length: {{batches: {batches}}}}}
        min_validation_period: {{batches: 4}}
        resources: {{slots_per_trial: {slots}}}
        reproducibility: {{experiment_seed: 2024}}
    """))
    return path


@pytest.fixture
def code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "ds_launched.py").write_text(TRIAL)
    monkeypatch.setenv("PYTHONPATH", f"{SUPPORT}:{Path(det.__file__).parent.parent}")  # trials_deepspeed (which
    # also sets DET_DEEPSPEED_SHM_COMM=0: Launch drops the DET_* variables of this process)
    return code


def test_sigterm_preempts_a_zero1_run_and_it_resumes_on_two_ranks(
    tmp_path: Path, code_dir: Path, launches: list[Launch]
) -> None:
    run_dir = tmp_path / "runs"
    args = ["--config", str(_config(tmp_path, "slow.yaml", sleep=0.2)), "--trial", "ds_launched.py:LaunchedTrial"]
    first = Launch(args, code_dir, run_dir, launcher="deepspeed")
    launches.append(first)
    first.wait_for(r"^\[rank=0\] rank 0 trained batch 2$")
    first.proc.send_signal(signal.SIGTERM)
    returncode, _ = first.finish()
    assert returncode == 75, first.output
    done = first.batches()
    assert max(done[0]) == max(done[1]) < LENGTH - 1
    stopped_after = max(done[0]) + 1
    (checkpoint,) = [c for c in det.core.LocalStore(run_dir).checkpoints() if c.steps_completed == stopped_after]
    assert {f"det_state_rank{r}.pth" for r in (0, 1)} <= set(checkpoint.resources)
    assert {f"model0/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= set(checkpoint.resources)
    consolidated = det.deepspeed.consolidate_checkpoint(run_dir / "checkpoints" / checkpoint.uuid)
    make_model().load_state_dict(consolidated)  # one plain state_dict of the 2-rank ZeRO-1 checkpoint
    assert_nothing_left(first, tmp_path)

    resume = ["--config", str(_config(tmp_path, "quick.yaml")), "--latest-checkpoint", "latest",
              "--trial", "ds_launched.py:LaunchedTrial"]
    second = Launch(resume, code_dir, run_dir, launcher="deepspeed")
    launches.append(second)
    assert second.finish()[0] == 0, second.output
    assert second.batches() == {r: list(range(stopped_after, LENGTH)) for r in (0, 1)}
    final = json.loads((code_dir / "weights.json").read_text())
    for got, want in zip(final, plain_loop(LENGTH, 16)):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
    assert_nothing_left(second, tmp_path)


def test_a_two_rank_zero2_checkpoint_resumes_on_one_slot(tmp_path: Path, code_dir: Path,
                                                         launches: list[Launch]) -> None:
    run_dir, half = tmp_path / "runs", LENGTH // 2
    first = Launch(["--config", str(_config(tmp_path, "two.yaml", stage=2, batches=half)),
                    "--trial", "ds_launched.py:LaunchedTrial"], code_dir, run_dir, launcher="deepspeed")
    launches.append(first)
    assert first.finish()[0] == 0, first.output
    one_slot = _config(tmp_path, "one.yaml", slots=1, stage=2, micro=8)  # the same 16 records per batch
    second = Launch(["--config", str(one_slot), "--latest-checkpoint", "latest", "--trial", "ds_launched.py:LaunchedTrial"],
                    code_dir, run_dir, launcher="deepspeed")
    launches.append(second)
    assert second.finish()[0] == 0, second.output
    assert second.batches() == {0: list(range(half, LENGTH))}
    final = json.loads((code_dir / "weights.json").read_text())
    for got, want in zip(final, plain_loop(LENGTH, 16)):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
    assert_nothing_left(second, tmp_path)


def test_a_failing_rank_stops_the_torch_distributed_job_within_seconds(
    tmp_path: Path, code_dir: Path, launches: list[Launch]
) -> None:
    config = _config(tmp_path, "fail.yaml", stage=0, sleep=0.1, fail_rank=1, fail_at=3)
    launch = Launch(["--config", str(config), "--trial", "ds_launched.py:LaunchedTrial"], code_dir, tmp_path / "runs")
    launches.append(launch)
    raised = launch.wait_for(r"^\[rank=1\] rank 1 trained batch 3$")
    returncode, ended = launch.finish()
    assert returncode != 0, launch.output
    assert ended - raised < 15, f"the launcher took {ended - raised:.1f} s to stop after the failure"
    assert "rank 1 failed with exit code" in launch.output and "RuntimeError: boom in batch 3" in launch.output
    assert max(launch.batches()[0]) < 8
    assert_nothing_left(launch, tmp_path)


def test_the_command_wraps_deepspeeds_runner_with_overrides_last(tmp_path: Path) -> None:
    from determined_trials.config import load_config
    from determined_trials.launch import _args
    from determined_trials.launch.deepspeed import build_command

    two = load_config(_config(tmp_path, "two.yaml"))
    cmd, env = build_command(_args.parse(["--trial", "m.py:T"], engine="deepspeed"), two)
    runner = cmd[cmd.index("deepspeed.launcher.runner") + 1:cmd.index("determined_trials.launch.wrap_rank") - 2]
    assert runner[:2] == ["--num_gpus", "2"] and runner[-2:] == ["--no_python", "--no_local_rank"]
    assert cmd[-3:] == ["determined_trials.launch.harness", "--trial", "m.py:T"] and "RANK" in cmd
    assert env["USE_DEEPSPEED"] == "1" and env["DET_CHIEF_IP"] == "127.0.0.1"
    cmd, _ = build_command(_args.parse(["--hostfile", "hosts", "--", "train.py"], engine="deepspeed"), two)
    assert "--num_gpus" not in cmd and cmd[cmd.index("--no_local_rank") + 1:][:2] == ["--hostfile", "hosts"]
    one = load_config(_config(tmp_path, "one.yaml").read_text().replace("slots_per_trial: 2", "slots_per_trial: 1"))
    cmd, _ = build_command(_args.parse(["--trial", "m.py:T"], engine="deepspeed"), one)
    assert "deepspeed.launcher.runner" not in cmd and cmd[cmd.index("determined_trials.launch.wrap_rank") + 1] == "0"


def test_deepspeeds_launcher_logs_warnings_only_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_trials.config import load_config
    from determined_trials.launch import _args
    from determined_trials.launch.deepspeed import build_command

    two = load_config(_config(tmp_path, "two.yaml"))
    monkeypatch.delenv("DET_DEEPSPEED_LOG_LEVEL", raising=False)
    cmd, _ = build_command(_args.parse(["--trial", "m.py:T"], engine="deepspeed"), two)
    assert cmd[cmd.index("--log_level") + 1] == "warning"
    monkeypatch.setenv("DET_DEEPSPEED_LOG_LEVEL", "INFO")
    cmd, _ = build_command(_args.parse(["--trial", "m.py:T"], engine="deepspeed"), two)
    assert cmd[cmd.index("--log_level") + 1] == "info"
    monkeypatch.setenv("DET_DEEPSPEED_LOG_LEVEL", "loud")
    with pytest.raises(_args.LaunchError, match="DET_DEEPSPEED_LOG_LEVEL='loud' is not a log level"):
        build_command(_args.parse(["--trial", "m.py:T"], engine="deepspeed"), two)


def test_one_node_of_several_runs_its_ranks_with_torchruns_multi_node_rendezvous(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_trials.config import load_config
    from determined_trials.launch import _args
    from determined_trials.launch.deepspeed import build_command

    for name, value in {"DET_NNODES": "2", "DET_NODE_RANK": "1", "DET_CHIEF_IP": "10.0.0.5",
                        "DET_MASTER_PORT": "29400"}.items():
        monkeypatch.setenv(name, value)
    two = load_config(_config(tmp_path, "two.yaml"))
    cmd, env = build_command(_args.parse(["--trial", "m.py:T"], engine="deepspeed"), two)
    assert "deepspeed.launcher.runner" not in cmd and "torch.distributed.run" in cmd
    torchrun = " ".join(cmd[:cmd.index("--no-python")])
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 1" in torchrun
    assert "--master_addr 10.0.0.5 --master_port 29400" in torchrun
    assert env["USE_DEEPSPEED"] == "1" and env["DET_CHIEF_IP"] == "10.0.0.5"
    with pytest.raises(_args.LaunchError, match="do not apply"):
        build_command(_args.parse(["--num_gpus", "2", "--", "--trial", "m.py:T"], engine="deepspeed"), two)
