# The two set-up commands of the README: `make example` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv deepspeed-ops azurite example example-trainer example-core test test-gpu gpu-wheels lint benchmark clean config-reference browser ui-screenshots

venv: $(STAMP) deepspeed-ops

# Everything (`make test`, `make venv`): every extra, the dev tools, TensorFlow's CPU build. pip shows its progress.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -c constraints.txt -e '.[pytorch,deepspeed,ray,examples,ui,dev,mlflow,wandb,gcs,azure,optuna,streaming]' 'tensorflow-cpu>=2.16'
	touch $(STAMP)

# DeepSpeed's CPU Adam op (ZeRO-Offload's optimizer, docs/deepspeed.md), compiled once into the torch extensions
# cache (~70 s the first time; once cached, it is only loaded): never inside a trial or a test's timeout.
deepspeed-ops: $(STAMP)
	DS_ACCELERATOR=cpu $(BIN)/python -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(verbose=False)"

# What `make example` (and example-trainer, example-core) needs: the [example] extra (PyTorch, scikit-learn);
# a full venv already has it.
EXAMPLE_STAMP := $(VENV)/.installed-example
EXAMPLE_VENV := $(if $(wildcard $(STAMP)),$(STAMP),$(EXAMPLE_STAMP))

$(EXAMPLE_STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -c constraints.txt -e '.[example]'
	touch $(EXAMPLE_STAMP)

# Azurite (Azure Blob Storage's emulator, a Node package) for the Azure storage tests, into the venv.
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob

azurite: $(AZURITE)

$(AZURITE):
	@if command -v npm >/dev/null 2>&1; then npm install --silent --no-audit --no-fund --prefix $(VENV)/azurite azurite@3.37.0; \
	else echo "make azurite: npm (Node.js) is not installed; the Azure storage tests will be skipped"; fi

EXAMPLE_RUN_DIR := det-runs/digits_search
TRAINER_EXAMPLE_RUN_DIR := det-runs/digits_pytorch
CORE_EXAMPLE_RUN_DIR := det-runs/core_api_digits

# The main job: a local grid search over the digits PyTorchTrial (6 trials), ending with the trials table.
example: $(EXAMPLE_VENV)
	rm -rf $(EXAMPLE_RUN_DIR)
	$(BIN)/det-trials --run-dir $(EXAMPLE_RUN_DIR) experiment create --no-progress \
		examples/digits_pytorch/search.yaml examples/digits_pytorch
	$(BIN)/det-trials --run-dir $(EXAMPLE_RUN_DIR) checkpoint list

# The same trial trained once with Trainer.fit in a plain script.
example-trainer: $(EXAMPLE_VENV)
	rm -rf $(TRAINER_EXAMPLE_RUN_DIR)
	$(BIN)/python examples/digits_pytorch/train.py --run-dir $(TRAINER_EXAMPLE_RUN_DIR)
	$(BIN)/det-trials --run-dir $(TRAINER_EXAMPLE_RUN_DIR) trial metrics 1 --group validation

# The Core API example: a plain PyTorch script, preempted after 3 epochs and resumed.
example-core: $(EXAMPLE_VENV)
	rm -rf $(CORE_EXAMPLE_RUN_DIR)
	$(BIN)/python examples/core_api_digits/train.py --run-dir $(CORE_EXAMPLE_RUN_DIR) --preempt-after-epochs 3
	$(BIN)/python examples/core_api_digits/train.py --run-dir $(CORE_EXAMPLE_RUN_DIR) --resume latest
	$(BIN)/det-trials --run-dir $(CORE_EXAMPLE_RUN_DIR) trial list
	$(BIN)/det-trials --run-dir $(CORE_EXAMPLE_RUN_DIR) checkpoint list

benchmark: venv
	$(BIN)/python benchmarks/run_all.py

# The dashboard's browser tests drive Debian's chromium through Playwright (never Playwright's own browser
# download): install it with apt-get (root, or sudo; without recommended packages) when it is missing; if
# that is impossible they are skipped, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		  ($$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium) \
		  || echo "make browser: could not install chromium; the browser tests will be skipped"; }

test: venv browser azurite
	$(BIN)/python -m pytest -q

# Screenshots of the dashboard's three pages for docs/ (docs/ui-*.png), taken by the browser tests' Chromium.
ui-screenshots: venv browser
	DET_UI_SCREENSHOTS=docs $(BIN)/python -m pytest -q tests/ui/test_ui_browser.py -k screenshots

# The GPU tier: the tests marked gpu (CUDA resume, pinned copies, no syncs, no memory kept), each listed
# by name; without CUDA every one is reported SKIPPED with its reason.
test-gpu: venv
	$(BIN)/python -m pytest -m gpu -v -rs

# Wheels a GPU machine without network needs beside its own torch (docs/gpu.md), for its Python 3.12, into
# .whl/ (ignored; carried with benchmarks/gpu_check.sh). DeepSpeed ships as an sdist: built here, ops off.
GPU_WHEELS := pyzmq==27.3.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	typing-extensions==4.16.0 hjson==3.1.0 einops==0.8.2 msgpack==1.2.4 py-cpuinfo==9.0.0
PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux1_x86_64,--platform $(p))

gpu-wheels: venv
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(PLATFORMS) -d .whl $(GPU_WHEELS)
	DS_BUILD_OPS=0 $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8

lint: venv
	$(BIN)/ruff check determined_trials tests examples
	$(BIN)/mypy determined_trials

clean:
	rm -rf $(VENV) det-runs

.PHONY: example-keras benchmark-keras
KERAS_EXAMPLE_RUN_DIR := det-runs/iris_keras

# The TFKerasTrial example: iris with Keras 3 through `det-trials experiment create`, then its metrics.
example-keras: venv
	rm -rf $(KERAS_EXAMPLE_RUN_DIR)
	$(BIN)/det-trials --run-dir $(KERAS_EXAMPLE_RUN_DIR) experiment create --no-progress \
		examples/iris_keras/const.yaml examples/iris_keras
	$(BIN)/det-trials --run-dir $(KERAS_EXAMPLE_RUN_DIR) trial metrics 1 --group validation

# Trainer.fit of a TFKerasTrial against plain model.fit (same model, data and steps; one process).
benchmark-keras: venv
	$(BIN)/python benchmarks/keras_overhead.py

# Regenerate docs/config-reference.md from the config schema (tests/config/test_config_reference.py checks it).
config-reference: venv
	$(BIN)/python -m determined_trials.config._reference > docs/config-reference.md

benchmark-ray: venv
	$(BIN)/python benchmarks/ray_executor.py

DEEPSPEED_EXAMPLE_RUN_DIR := det-runs/deepspeed_digits

# The DeepSpeedTrial example: ZeRO-2 with gradient accumulation on 2 processes (DeepSpeed's launcher), as a
# local experiment. DET_DEEPSPEED_SHM_COMM=0 skips the 35 s JIT build of DeepSpeed's CPU shared-memory op.
example-deepspeed: venv
	rm -rf $(DEEPSPEED_EXAMPLE_RUN_DIR)
	DET_DEEPSPEED_SHM_COMM=0 $(BIN)/det-trials --run-dir $(DEEPSPEED_EXAMPLE_RUN_DIR) experiment create --no-progress \
		examples/deepspeed_digits/const.yaml examples/deepspeed_digits
	$(BIN)/det-trials --run-dir $(DEEPSPEED_EXAMPLE_RUN_DIR) checkpoint list

# DeepSpeedTrial through Trainer.fit against a hand-written DeepSpeed engine loop (ZeRO 0 and 2, 1 process;
# then ZeRO 3 on 2 processes).
benchmark-deepspeed: venv
	DET_DEEPSPEED_SHM_COMM=0 $(BIN)/python benchmarks/deepspeed_overhead.py
	DET_DEEPSPEED_SHM_COMM=0 $(BIN)/python benchmarks/zero3.py

.PHONY: example-deepspeed benchmark-deepspeed

FSDP_EXAMPLE_RUN_DIR := det-runs/fsdp_mlp

# The FSDP2 example: an MLP sharded with fully_shard on 2 CPU processes (gloo) as a local experiment, with
# background DCP checkpoints; then one plain state_dict of its last checkpoint (docs/fsdp.md).
example-fsdp: venv
	rm -rf $(FSDP_EXAMPLE_RUN_DIR) $(FSDP_EXAMPLE_RUN_DIR)-export
	$(BIN)/det-trials --run-dir $(FSDP_EXAMPLE_RUN_DIR) experiment create --no-progress \
		examples/fsdp_mlp/const.yaml examples/fsdp_mlp
	$(BIN)/det-trials --run-dir $(FSDP_EXAMPLE_RUN_DIR) checkpoint list
	$(BIN)/det-trials --run-dir $(FSDP_EXAMPLE_RUN_DIR) checkpoint export --consolidate \
		$$($(BIN)/python -c "import determined_trials as det; print(det.core.LocalStore('$(FSDP_EXAMPLE_RUN_DIR)').checkpoints()[-1].uuid)") \
		$(FSDP_EXAMPLE_RUN_DIR)-export

.PHONY: example-fsdp

LM_EXAMPLE_RUN_DIR := det-runs/tiny_lm

# The language-model example: a GPT-2-style byte-level model on the standard library's sources, streamed
# through Hugging Face datasets, FSDP2 on 2 CPU processes (gloo) as a local experiment; then its validation
# loss and perplexity (examples/tiny_lm/README.md). Hugging Face's libraries stay offline: nothing is downloaded.
example-lm: venv
	rm -rf $(LM_EXAMPLE_RUN_DIR)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/det-trials --run-dir $(LM_EXAMPLE_RUN_DIR) \
		experiment create --no-progress examples/tiny_lm/const.yaml examples/tiny_lm
	$(BIN)/det-trials --run-dir $(LM_EXAMPLE_RUN_DIR) trial metrics 1 --group validation

.PHONY: example-lm

STREAM_EXAMPLE_RUN_DIR := det-runs/streaming_digits
STREAM_TRAIN := cd examples/streaming_digits && $(abspath $(BIN))/python train.py --no-progress
STREAM_RUNS := $(abspath $(STREAM_EXAMPLE_RUN_DIR))

# The streaming example: scikit-learn's digits as a stream that saves its position (examples/streaming_digits):
# an uninterrupted run, then a run stopped after batch 100 and resumed; both read the same records, batch by batch.
example-stream: venv
	rm -rf $(STREAM_EXAMPLE_RUN_DIR) && mkdir -p $(STREAM_EXAMPLE_RUN_DIR)
	$(STREAM_TRAIN) --run-dir $(STREAM_RUNS)/whole --records $(STREAM_RUNS)/whole.txt
	$(STREAM_TRAIN) --run-dir $(STREAM_RUNS)/stopped --records $(STREAM_RUNS)/stopped.txt --stop-after-batches 100
	$(STREAM_TRAIN) --run-dir $(STREAM_RUNS)/stopped --records $(STREAM_RUNS)/stopped.txt --resume latest
	cmp $(STREAM_RUNS)/whole.txt $(STREAM_RUNS)/stopped.txt && \
		echo "the stopped and resumed run read the uninterrupted run's records, batch by batch"

.PHONY: example-stream
