"""A small GPT-2-style language model as a PyTorchTrial: a ``transformers`` GPT2LMHeadModel built from its
config (random initialisation, nothing downloaded) on byte-level tokens of the standard library's sources,
streamed through Hugging Face ``datasets`` (corpus.py). AdamW, linear warm-up then cosine decay (stepped
every batch), gradient clipping, bfloat16 autocast on a GPU (float32 on the CPU), FSDP2 (``fully_shard`` on
each transformer block, then the root) when torch.distributed runs. Reports the training loss, and the
validation loss and perplexity."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing reaches the network
logging.getLogger("datasets").setLevel(logging.WARNING)  # not its import-time INFO line on TensorFlow

import corpus  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from determined_trials import pytorch  # noqa: E402


def build_model(hparams: dict[str, Any], device: torch.device) -> nn.Module:
    """GPT2LMHeadModel from a GPT2Config (random weights from torch's seeded RNG), sharded with FSDP2
    when torch.distributed is initialised (unsharded in one process, e.g. for inference)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=corpus.VOCAB_SIZE, n_positions=hparams["block_size"], n_embd=hparams["width"],
        n_layer=hparams["layers"], n_head=hparams["heads"], bos_token_id=corpus.EOS, eos_token_id=corpus.EOS,
        resid_pdrop=hparams.get("dropout", 0.0), embd_pdrop=hparams.get("dropout", 0.0),
        attn_pdrop=hparams.get("dropout", 0.0),
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # transformers does not map GPT2LMHeadModel to its loss by name: say it
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed.fsdp import fully_shard

        model = model.to(device)
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)  # the root: embeddings, final norm and the (tied) output head
    return model


class Perplexity(pytorch.MetricReducer):
    """exp of the mean token loss over every validation block of every rank (weighted by tokens)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss_sum: torch.Tensor | float = 0.0
        self.tokens = 0

    def update(self, mean_loss: torch.Tensor, tokens: int) -> None:
        self.loss_sum = self.loss_sum + mean_loss.detach().float() * tokens  # stays on the device
        self.tokens += tokens

    def per_slot_reduce(self) -> tuple[float, int]:
        return float(self.loss_sum), self.tokens

    def cross_slot_reduce(self, per_slot_metrics: list[tuple[float, int]]) -> float:
        tokens = sum(count for _, count in per_slot_metrics)
        return math.exp(sum(total for total, _ in per_slot_metrics) / max(tokens, 1))


class TinyLMTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        from transformers import get_cosine_schedule_with_warmup

        self.context = context
        self.hp = context.get_hparams()
        self.model = context.wrap_model(build_model(self.hp, context.device))
        self.optimizer = context.wrap_optimizer(torch.optim.AdamW(
            self.model.parameters(), lr=self.hp["lr"], betas=(0.9, 0.95), weight_decay=self.hp["weight_decay"]))
        schedule = get_cosine_schedule_with_warmup(self.optimizer, num_warmup_steps=self.hp["warmup_batches"],
                                                   num_training_steps=self.hp["schedule_batches"])
        context.wrap_lr_scheduler(schedule, pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        self.on_gpu = context.device.type == "cuda"
        self.perplexity = context.wrap_reducer(Perplexity(), name="validation_perplexity", for_training=False)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(corpus.blocks("train", self.hp["block_size"]),
                                  batch_size=self.context.get_per_slot_batch_size(), collate_fn=corpus.collate)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        held_out = corpus.blocks("validation", self.hp["block_size"], limit=self.hp["validation_blocks"])
        batch_size = self.context.get_per_slot_batch_size()
        return pytorch.DataLoader(held_out, batch_size=batch_size, collate_fn=corpus.collate)

    def _loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """The mean next-byte cross-entropy of a batch of blocks (the model shifts the labels itself)."""
        with self.context.autocast(torch.bfloat16, enabled=self.on_gpu):
            return self.model(input_ids=tokens, labels=tokens).loss.float()

    def train_batch(self, batch: torch.Tensor, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        loss = self._loss(batch)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer, clip_grads=self._clip)
        return {"loss": loss}

    def _clip(self, params: list[torch.Tensor]) -> None:
        nn.utils.clip_grad_norm_(params, self.hp["clip"])  # under FSDP2: the norm of the whole model

    def evaluate_batch(self, batch: torch.Tensor) -> dict[str, Any]:
        loss = self._loss(batch)
        self.perplexity.update(loss, batch.shape[0] * (batch.shape[1] - 1))  # predicted tokens
        return {"validation_loss": loss}
