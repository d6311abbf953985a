"""TFKerasTrial under Trainer.fit in one process: closed-form training, learning, hooks and callbacks,
exact mid-epoch resume, metrics, checkpoints and the errors raised before training."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from trials_keras import MLPTrial, OneVarTrial  # noqa: E402

from determined_trials import keras as det_keras  # noqa: E402
from determined_trials.errors import ConfigError  # noqa: E402
from determined_trials.loop import ExitReason  # noqa: E402

keras = det_keras.callbacks.keras


def _config(hparams: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"hyperparameters": hparams, "reproducibility": {"experiment_seed": 7},
            "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 100}}, **extra}


def _fit(trial_cls: type, run_dir: Path, hparams: dict[str, Any], **fit: Any) -> tuple[Any, Any, Any]:
    with det_keras.init(exp_conf=_config(hparams), run_dir=run_dir) as context:
        trial = trial_cls(context)
        trainer = det_keras.Trainer(trial, context)
        trainer.fit(**{"show_progress": False, **fit})
        return trial, context, trainer


def _latest(run_dir: Path) -> str:
    from determined_trials.core import LocalStore

    store = LocalStore(run_dir)
    try:
        return store.checkpoints()[-1].uuid
    finally:
        store.close()


def test_one_variable_model_follows_the_closed_form_per_batch(tmp_path: Path) -> None:
    lr, size = 0.5, 4
    trial, _, trainer = _fit(OneVarTrial, tmp_path, {"global_batch_size": size, "lr": lr},
                             max_length=det_keras.Epoch(2), reporting_period=det_keras.Batch(1))
    x = (np.arange(10, dtype=np.float64) + 1) / 10
    w, weights, losses = 0.0, [], []
    for _ in range(2):
        for start in range(0, 10, size):  # in order (shuffle off), last partial batch of 2 kept
            xb = x[start:start + size]
            losses.append(np.mean((w * xb - 2 * xb) ** 2))
            w -= lr * np.mean(2 * (w * xb - 2 * xb) * xb)
            weights.append(w)
    assert trainer.exit_reason is ExitReason.COMPLETED
    np.testing.assert_allclose(trial.recorder.weights, weights, rtol=1e-5)
    np.testing.assert_allclose(trial.recorder.losses, losses, rtol=1e-5)


def test_shuffled_order_is_the_seeded_permutation(tmp_path: Path) -> None:
    from determined_trials.loop._data_order import epoch_permutation

    lr = 0.5
    trial, context, _ = _fit(OneVarTrial, tmp_path, {"global_batch_size": 10, "lr": lr, "shuffle": True},
                             max_length=det_keras.Batch(3), reporting_period=det_keras.Batch(1))
    x = (np.arange(10, dtype=np.float64) + 1) / 10
    w, weights = 0.0, []
    for epoch in range(3):  # one batch per epoch: the order does not change the mean, so use 3 of 5
        order = epoch_permutation(10, context.get_trial_seed(), epoch)[:10]
        xb = x[order]
        w -= lr * np.mean(2 * (w * xb - 2 * xb) * xb)
        weights.append(w)
    np.testing.assert_allclose(trial.recorder.weights, weights, rtol=1e-5)


def test_loss_falls_on_a_learnable_task(tmp_path: Path) -> None:
    _, context, _ = _fit(MLPTrial, tmp_path, {"global_batch_size": 16}, max_length=det_keras.Epoch(8),
                         validation_period=det_keras.Epoch(1))
    from determined_trials.core import LocalStore

    store = LocalStore(tmp_path)
    try:
        rows = store.metrics(trial_id=context.get_trial_id(), group="validation")
    finally:
        store.close()
    losses = [r.metrics["val_loss"] for r in rows]
    assert len(losses) == 8
    assert losses[-1] < 0.5 * losses[0]
    assert rows[-1].metrics["val_accuracy"] > 0.9


def test_keras_callbacks_see_epochs_batches_and_tests_in_order(tmp_path: Path) -> None:
    trial, _, _ = _fit(OneVarTrial, tmp_path, {"global_batch_size": 4, "lr": 0.1},
                       max_length=det_keras.Epoch(2), validation_period=det_keras.Batch(2))
    names = [name if arg is None or name == "test_end" else f"{name}{arg}" for name, arg in trial.recorder.calls]
    names = [n for n in names if n != "test_begin"]
    assert names == ["train_begin", "epoch_begin0", "batch_end0", "batch_end1", "test_end", "batch_end2",
                     "epoch_end0", "epoch_begin1", "batch_end0", "test_end", "batch_end1", "batch_end2",
                     "epoch_end1", "test_end", "train_end"]
    test_logs = [arg for name, arg in trial.recorder.calls if name == "test_end"]
    assert all(set(logs) == {"loss"} for logs in test_logs)


def _weights(model: Any) -> list[np.ndarray]:
    return [np.array(v) for v in model.get_weights()] + [np.array(v) for v in model.optimizer.variables]


@pytest.mark.parametrize("data", ["arrays", "pydataset"])
def test_stop_request_mid_epoch_then_resume_is_bitwise_exact(tmp_path: Path, data: str) -> None:
    hp = {"global_batch_size": 16, "data": data}
    _, whole, _ = _fit(MLPTrial, tmp_path / "whole", hp, max_length=det_keras.Batch(15))
    _, _, first = _fit(MLPTrial, tmp_path / "parts", {**hp, "stop_at": 8}, max_length=det_keras.Batch(15))
    assert first.exit_reason is ExitReason.STOPPED
    _, resumed, second = _fit(MLPTrial, tmp_path / "parts", hp, max_length=det_keras.Batch(15),
                              latest_checkpoint=_latest(tmp_path / "parts"))
    assert second.exit_reason is ExitReason.COMPLETED
    expected, got = _weights(whole.models[0]), _weights(resumed.models[0])
    assert int(resumed.models[0].optimizer.iterations) == 15
    assert len(expected) == len(got) and all(np.array_equal(a, b) for a, b in zip(expected, got))


def test_latest_resumes_a_plain_script_like_pytorch(tmp_path: Path) -> None:
    hp = {"global_batch_size": 16, "data": "arrays"}
    _, whole, _ = _fit(MLPTrial, tmp_path / "whole", hp, max_length=det_keras.Batch(15))
    _, _, first = _fit(MLPTrial, tmp_path / "parts", {**hp, "stop_at": 8}, max_length=det_keras.Batch(15))
    assert first.exit_reason is ExitReason.STOPPED
    _, resumed, second = _fit(MLPTrial, tmp_path / "parts", hp, max_length=det_keras.Batch(15),
                              latest_checkpoint="latest")
    assert second.exit_reason is ExitReason.COMPLETED
    assert int(resumed.models[0].optimizer.iterations) == 15
    expected, got = _weights(whole.models[0]), _weights(resumed.models[0])
    assert all(np.array_equal(a, b) for a, b in zip(expected, got))


def test_checkpoint_loads_as_a_compiled_model(tmp_path: Path) -> None:
    _, context, _ = _fit(MLPTrial, tmp_path, {"global_batch_size": 16}, max_length=det_keras.Batch(5))
    folders = [p.parent for p in tmp_path.rglob("model.keras")]
    assert len(folders) == 1 and folders[0].name == _latest(tmp_path)
    folder = folders[0]
    model = det_keras.load_model_from_checkpoint_path(folder)
    assert int(model.optimizer.iterations) == 5
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), context.models[0].get_weights()))
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        det_keras.load_model_from_checkpoint_path(tmp_path / "nothing")


def test_searcher_metric_may_name_the_unprefixed_form(tmp_path: Path) -> None:
    config = {"hyperparameters": {"global_batch_size": 16},
              "searcher": {"name": "single", "metric": "accuracy", "smaller_is_better": False,
                           "max_length": {"batches": 4}}}
    with det_keras.init(exp_conf=config, run_dir=tmp_path) as context:
        trainer = det_keras.Trainer(MLPTrial(context), context)
        trainer.fit(validation_period=det_keras.Batch(2), show_progress=False)  # searcher length, policy best
    assert trainer.exit_reason is ExitReason.COMPLETED


class _NoWrap(MLPTrial):
    def build_model(self) -> Any:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile("sgd", "mse")
        return model


class _NoCompile(MLPTrial):
    def build_model(self) -> Any:
        return self.context.wrap_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]))


class _BadMetric(MLPTrial):
    def build_model(self) -> Any:
        model = self.context.wrap_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]))
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[5])
        return model


class _RawTFData(MLPTrial):
    def build_training_data_loader(self) -> Any:
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(super().build_training_data_loader()).batch(8)


class _WrongData(MLPTrial):
    def build_training_data_loader(self) -> Any:
        return {"x": 1}


@pytest.mark.parametrize(("trial_cls", "hparams", "error", "match"), [
    (_NoWrap, {"global_batch_size": 16}, RuntimeError, "did not call context.wrap_model"),
    (_NoCompile, {"global_batch_size": 16}, RuntimeError, "did not compile"),
    (_BadMetric, {"global_batch_size": 16}, ValueError, "metric"),
    (_RawTFData, {"global_batch_size": 16}, TypeError, "wrap_dataset"),
    (_WrongData, {"global_batch_size": 16}, TypeError, "PyDataset"),
    (MLPTrial, {}, ConfigError, "global_batch_size"),
])
def test_errors_are_raised_before_training(tmp_path: Path, trial_cls: type, hparams: dict[str, Any],
                                           error: type, match: str) -> None:
    with det_keras.init(hparams=hparams, run_dir=tmp_path) as context:
        trainer = det_keras.Trainer(trial_cls(context), context)
        with pytest.raises(error, match=match):
            trainer.fit(max_length=det_keras.Batch(2), show_progress=False)
        optimizer = getattr(context.models[0], "optimizer", None) if context.models else None
        assert optimizer is None or int(optimizer.iterations) == 0  # nothing trained


def test_global_batch_size_not_divisible_by_the_slots(tmp_path: Path) -> None:
    config = {"hyperparameters": {"global_batch_size": 15}, "resources": {"slots_per_trial": 2},
              "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 2}}}
    with det_keras.init(exp_conf=config, run_dir=tmp_path) as context:
        with pytest.raises(ConfigError, match="not divisible"):
            det_keras.Trainer(MLPTrial(context), context).fit(show_progress=False)


def test_session_config_is_ignored_with_one_warning(tmp_path: Path) -> None:
    class WithSession(MLPTrial):
        def session_config(self) -> Any:
            return {"intra_op_parallelism_threads": 1}

    with det_keras.init(hparams={"global_batch_size": 16}, run_dir=tmp_path) as context:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            det_keras.Trainer(WithSession(context), context)
    assert [str(w.message) for w in caught if "session_config" in str(w.message)]


def _plain_fit(core_context: Any, epochs: int, checkpoint: str | None, continue_id: str) -> tuple[Any, list[int]]:
    from trials_keras import blobs

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    epochs_run: list[int] = []
    seen = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs_run.append(epoch))
    x, y = blobs()
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, validation_data=blobs(seed=1), verbose=0,
              callbacks=[det_keras.DeterminedCallback(core_context, checkpoint, continue_id), seen])
    return model, epochs_run


def test_determined_callback_reports_checkpoints_and_continues_at_the_next_epoch(tmp_path: Path) -> None:
    import determined_trials as det
    from determined_trials.core import LocalStore

    with det.core.init(run_dir=tmp_path / "whole") as core_context:
        whole, _ = _plain_fit(core_context, 5, None, "a")
        trial_id = core_context.info.trial.trial_id
    store = LocalStore(tmp_path / "whole")
    try:
        training = store.metrics(trial_id=trial_id, group="training")
        validation = store.metrics(trial_id=trial_id, group="validation")
        assert [r.metrics["epochs"] for r in training] == [1, 2, 3, 4, 5]
        assert [r.steps_completed for r in validation] == [6, 12, 18, 24, 30]
        assert "val_accuracy" in validation[-1].metrics and "val_loss" not in training[-1].metrics
        assert len(store.checkpoints()) == 5
    finally:
        store.close()
    with det.core.init(run_dir=tmp_path / "parts") as core_context:
        _plain_fit(core_context, 3, None, "b")
        uuid = _latest(tmp_path / "parts")
        resumed, epochs_run = _plain_fit(core_context, 5, uuid, "b")
        assert epochs_run == [3, 4]
        assert all(np.array_equal(a, b) for a, b in zip(_weights(whole), _weights(resumed)))
        _, warm_epochs = _plain_fit(core_context, 2, uuid, "another run")
        assert warm_epochs == [0, 1]  # another continue_id: the weights are a warm start


class _Workloads(det_keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []
        self.restored: Any = None

    def on_train_workload_begin(self, total_batches_trained: int, batches_requested: int, logs: Any) -> None:
        self.events.append(("begin", total_batches_trained))

    def on_train_workload_end(self, total_batches_trained: int, logs: Any) -> None:
        assert "loss" in logs
        self.events.append(("end", total_batches_trained))

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        assert Path(checkpoint_dir, "model.weights.h5").exists()
        self.events.append(("checkpoint", self.events[-1][1]))

    def get_state(self) -> Any:
        return {"events": len(self.events)}

    def load_state(self, state: Any) -> None:
        self.restored = state


class _WithDetCallbacks(MLPTrial):
    def keras_callbacks(self) -> list[Any]:
        self.workloads = _Workloads()
        self.early = det_keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)
        return [self.workloads, self.early]


def test_det_callbacks_see_workloads_checkpoints_and_early_stopping_resumes(tmp_path: Path) -> None:
    trial, _, trainer = _fit(_WithDetCallbacks, tmp_path, {"global_batch_size": 16}, max_length=det_keras.Batch(30),
                             validation_period=det_keras.Batch(4), reporting_period=det_keras.Batch(2))
    # min_delta=10: the second validation is no improvement, patience 0 -> stop after batch 8
    assert trainer.exit_reason is ExitReason.STOPPED
    assert trial.workloads.events[:4] == [("begin", 0), ("end", 2), ("begin", 2), ("end", 4)]
    assert trial.workloads.events[-2:] == [("end", 8), ("checkpoint", 8)]
    assert trial.early.get_state()["validations"] == 2
    resumed, _, again = _fit(_WithDetCallbacks, tmp_path, {"global_batch_size": 16}, max_length=det_keras.Batch(30),
                             validation_period=det_keras.Batch(4), latest_checkpoint=_latest(tmp_path))
    assert resumed.workloads.restored == {"events": len(trial.workloads.events) - 1}  # saved before its own event
    assert resumed.early.get_state()["validations"] >= 3  # counting went on from the checkpoint's 2
    assert again.exit_reason is ExitReason.STOPPED


class _TFDataTrial(MLPTrial):
    def build_training_data_loader(self) -> Any:
        import tensorflow as tf

        x, y = super().build_training_data_loader()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=1).batch(16)
        return self.context.wrap_dataset(ds)


def test_wrapped_tf_data_trains_in_epochs_and_resumes_exactly(tmp_path: Path) -> None:
    hp = {"global_batch_size": 16, "dropout": 0.0}
    _, whole, _ = _fit(_TFDataTrial, tmp_path / "whole", hp, max_length=det_keras.Epoch(2))
    assert int(whole.models[0].optimizer.iterations) == 12  # 96 records / 16 per batch = 6 batches per epoch
    _, _, first = _fit(_TFDataTrial, tmp_path / "parts", {**hp, "stop_at": 8}, max_length=det_keras.Epoch(2))
    assert first.exit_reason is ExitReason.STOPPED
    _, resumed, _ = _fit(_TFDataTrial, tmp_path / "parts", hp, max_length=det_keras.Epoch(2),
                         latest_checkpoint=_latest(tmp_path / "parts"))
    assert all(np.array_equal(a, b) for a, b in zip(_weights(whole.models[0]), _weights(resumed.models[0])))


def test_from_config_gives_a_context_for_debugging_with_plain_keras() -> None:
    context = det_keras.TFKerasTrialContext.from_config({"hyperparameters": {"global_batch_size": 16,
                                                                               "data": "pydataset"}})
    trial = MLPTrial(context)
    model = trial.build_model()
    history = model.fit(trial.build_training_data_loader(), epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    assert "accuracy" in model.evaluate(trial.build_validation_data_loader(), verbose=0, return_dict=True)


class _WithTensorBoard(MLPTrial):
    def keras_callbacks(self) -> list[Any]:
        return [det_keras.TensorBoard(self.context, update_freq="epoch"),
                det_keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0, min_delta=10.0)]


def test_tensorboard_writes_into_the_trial_folder_and_reduce_lr_acts_on_validations(tmp_path: Path) -> None:
    _, context, _ = _fit(_WithTensorBoard, tmp_path, {"global_batch_size": 16}, max_length=det_keras.Epoch(2),
                         validation_period=det_keras.Epoch(1))
    folder = Path(context._core.train.get_tensorboard_path())
    assert folder.is_relative_to(tmp_path) and list(folder.rglob("events.out.tfevents.*"))
    # the first validation improves on "no best yet"; the second does not by min_delta=10: the LR halves once
    assert float(context.models[0].optimizer.learning_rate) == pytest.approx(0.01 * 0.5)


class _BatchTensorBoard(MLPTrial):
    def keras_callbacks(self) -> list[Any]:
        self.tensorboard = det_keras.TensorBoard(self.context, update_freq=1)
        return [self.tensorboard, *super().keras_callbacks()]  # with the stop_at hparam's callback


def test_tensorboard_batch_counters_go_on_after_a_resume(tmp_path: Path) -> None:
    hp = {"global_batch_size": 16}
    fit: dict[str, Any] = {"max_length": det_keras.Batch(15), "validation_period": det_keras.Batch(5)}
    whole, _, _ = _fit(_BatchTensorBoard, tmp_path / "whole", hp, **fit)
    _, _, first = _fit(_BatchTensorBoard, tmp_path / "parts", {**hp, "stop_at": 8}, **fit)
    assert first.exit_reason is ExitReason.STOPPED
    resumed, _, _ = _fit(_BatchTensorBoard, tmp_path / "parts", hp, latest_checkpoint=_latest(tmp_path / "parts"),
                         **fit)
    state = whole.tensorboard.get_state()
    assert state["train_batches"] == 15 and state["test_batches"] > 0
    assert resumed.tensorboard.get_state() == state  # not 15 - 9 batches: the steps go on


def test_a_checkpoint_without_tensorboard_state_still_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints written before TensorBoard kept state hold none for it: the run resumes, counters fresh."""
    hp = {"global_batch_size": 16}
    fit: dict[str, Any] = {"max_length": det_keras.Batch(12), "validation_period": det_keras.Batch(4)}
    from determined_trials.keras._bridge import KerasCallbacks

    with monkeypatch.context() as patch:  # the old get_state: TensorBoard was no det.keras Callback
        real_get_state = KerasCallbacks.get_state
        patch.setattr(KerasCallbacks, "get_state", lambda self: [
            entry for entry in real_get_state(self) if entry[0] != "TensorBoard"])
        _, _, first = _fit(_BatchTensorBoard, tmp_path, {**hp, "stop_at": 5}, **fit)
    assert first.exit_reason is ExitReason.STOPPED
    stopped_at = first._context._core.store.checkpoints()[-1].steps_completed
    resumed, _, trainer = _fit(_BatchTensorBoard, tmp_path, hp, latest_checkpoint=_latest(tmp_path), **fit)
    assert trainer.exit_reason is ExitReason.COMPLETED
    assert resumed.tensorboard.get_state()["train_batches"] == 12 - stopped_at  # fresh: this run's batches only


class _ZeroClassWeights(MLPTrial):
    def build_model(self) -> Any:
        model = super().build_model()
        self.initial = [np.array(w) for w in model.get_weights()]
        self.context.configure_fit(class_weight={0: 0.0, 1: 0.0, 2: 0.0}, validation_steps=1)
        return model


def test_configure_fit_class_weight_weights_the_records(tmp_path: Path) -> None:
    trial, context, _ = _fit(_ZeroClassWeights, tmp_path, {"global_batch_size": 16, "dropout": 0.0},
                             max_length=det_keras.Batch(3))
    assert all(np.array_equal(a, b) for a, b in zip(trial.initial, context.models[0].get_weights()))
    with pytest.raises(TypeError, match="class_weight"):
        context.configure_fit(class_weight=[1.0, 2.0])
    with pytest.raises(ValueError, match="validation_steps"):
        context.configure_fit(validation_steps=0)


def test_keras_training_arrays_smaller_than_one_batch_warn() -> None:
    from determined_trials.keras._data import ArraySource

    data = (np.zeros((3, 2), np.float32), np.zeros(3, np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ArraySource(data, per_slot=4, rank=0, size=1, seed=0, shuffle=False, class_weight=None,
                    what="build_training_data_loader()")
        ArraySource(data, per_slot=4, rank=0, size=1, seed=0, shuffle=False, class_weight=None,
                    what="build_validation_data_loader()")
    assert [str(w.message) for w in caught] == [
        "the training data of build_training_data_loader() has 3 records, fewer than one batch (4 per rank x 1 "
        "rank(s) = 4): every step trains on the same 3 records, a short batch; use a smaller global_batch_size "
        "or more data"]


def test_a_mesh_is_refused_by_a_keras_trial() -> None:
    conf = {"hyperparameters": {"global_batch_size": 16}, "resources": {"slots_per_trial": 2, "mesh": {"tp": 2}}}
    with pytest.raises(ConfigError, match="resources.mesh is set, but a TFKerasTrialContext has no device mesh"):
        det_keras.TFKerasTrialContext.from_config(conf)
