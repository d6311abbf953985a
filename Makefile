# The two set-up commands of the README: `make example` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv example example-trainer example-core test lint benchmark clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[pytorch,deepspeed,examples,dev]' 'tensorflow-cpu>=2.16'
	touch $(STAMP)

EXAMPLE_RUN_DIR := det-runs/digits_search
TRAINER_EXAMPLE_RUN_DIR := det-runs/digits_pytorch
CORE_EXAMPLE_RUN_DIR := det-runs/core_api_digits

# The main job: a local grid search over the digits PyTorchTrial (6 trials), ending with the trials table.
example: venv
	rm -rf $(EXAMPLE_RUN_DIR)
	$(BIN)/det-trials --run-dir $(EXAMPLE_RUN_DIR) experiment create --no-progress \
		examples/digits_pytorch/search.yaml examples/digits_pytorch
	$(BIN)/det-trials --run-dir $(EXAMPLE_RUN_DIR) checkpoint list

# The same trial trained once with Trainer.fit in a plain script.
example-trainer: venv
	rm -rf $(TRAINER_EXAMPLE_RUN_DIR)
	$(BIN)/python examples/digits_pytorch/train.py --run-dir $(TRAINER_EXAMPLE_RUN_DIR)
	$(BIN)/det-trials --run-dir $(TRAINER_EXAMPLE_RUN_DIR) trial metrics 1 --group validation

# The Core API example: a plain PyTorch script, preempted after 3 epochs and resumed.
example-core: venv
	rm -rf $(CORE_EXAMPLE_RUN_DIR)
	$(BIN)/python examples/core_api_digits/train.py --run-dir $(CORE_EXAMPLE_RUN_DIR) --preempt-after-epochs 3
	$(BIN)/python examples/core_api_digits/train.py --run-dir $(CORE_EXAMPLE_RUN_DIR) --resume latest
	$(BIN)/det-trials --run-dir $(CORE_EXAMPLE_RUN_DIR) trial list
	$(BIN)/det-trials --run-dir $(CORE_EXAMPLE_RUN_DIR) checkpoint list

benchmark: venv
	$(BIN)/python benchmarks/run_all.py

test: venv
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check determined_trials tests examples
	$(BIN)/mypy determined_trials

clean:
	rm -rf $(VENV) det-runs
