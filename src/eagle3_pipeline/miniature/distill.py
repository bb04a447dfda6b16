"""Distillation: the miniature learns the teacher's thinking turns, cheaply on a CPU.

Each training row is the chat template's rendering of the prompt with the generation prompt
(which ends with ``<think>`` when thinking is on) followed by the turn the model should write,
``reasoning </think> answer <|im_end|>``; the loss covers that completion only.

A softmax over all 163,840 ids per token would dominate the cost on 2 cores, and only a few
thousand ids ever occur in the corpus. So the model is trained with a *compact* vocabulary: the
ids the rows use, plus one sink row that stands for every other id together. The sink's logit
gets ``log(number of other ids)`` added, which is exactly what those ids contribute to the full
softmax when each has the sink's weights; :func:`expand` then writes the trained rows back at
their ids, copies the sink row into every other lm_head row and the mean input embedding into
every other embedding row. The full model's probabilities over the used ids are therefore the
compact model's (up to float rounding), and an unused id is never more likely than the sink was
in training: the model never learns to write one.

The trained network is transformers' own ``DeepseekV3ForCausalLM`` at the miniature's shape:
the same class, and so the same arithmetic, that the exported checkpoint is checked against.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from . import config as cfg
from .tokenizer import VOCAB_SIZE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """What the default costs and gives is in docs/miniature.md. Small batches: learning here is
    limited by the number of steps, and a step's CPU cost per position hardly depends on the
    batch (590 positions/s at batch 4 against 530 at batch 2, one thread)."""

    seed: int = 0
    epochs: int = 30
    batch_size: int = 2
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.01
    max_len: int = 256  # prompt + completion tokens; longer rows are cut (prompt first)
    grad_clip: float = 1.0
    threads: int = 1  # 2 threads ran 2-3x slower than 1 on a busy 2-core machine
    sink_ramp: float = 0.3  # share of the steps over which the sink's offset grows to log(#others)


@dataclass
class TrainResult:
    state: dict  # trained compact state dict (float32)
    used_ids: list[int]  # compact row i <-> full id used_ids[i]; the last row is the sink
    losses: list[float] = field(default_factory=list)  # mean loss per epoch
    seconds: float = 0.0
    tokens: int = 0  # completion tokens per epoch
    final_loss: float = 0.0  # the trained model's loss on its rows, sink offset in full


def render_rows(tokenizer, samples: list[dict], max_len: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of each shaped sample: the prompt as the server renders it
    with thinking on, the completion as the model must write it."""
    rows = []
    for s in samples:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": s["prompt"]}],
            add_generation_prompt=True,
            tokenize=True,
            thinking=True,
        )
        if hasattr(prompt, "keys"):
            prompt = prompt["input_ids"]
        completion = tokenizer.encode(
            f"{s['reasoning']}</think>{s['answer']}<|im_end|>", add_special_tokens=False
        )
        budget = max_len - len(completion)
        if budget < 16:  # keep the generation prompt's tail, cut the completion
            completion = completion[: max_len - 64]
            budget = 64
        prompt = prompt[-budget:] if len(prompt) > budget else prompt
        rows.append((list(prompt), list(completion)))
    return rows


def _batches(order: list[int], size: int):
    for i in range(0, len(order), size):
        yield order[i : i + size]


def train(rows: list[tuple[list[int], list[int]]], settings: TrainSettings) -> TrainResult:
    """Train the miniature on ``rows`` with the compact vocabulary (module docstring)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    used = sorted({i for p, c in rows for i in (*p, *c)})
    sink = len(used)
    lookup = torch.full((VOCAB_SIZE,), sink, dtype=torch.long)
    lookup[torch.tensor(used)] = torch.arange(len(used))
    sink_offset = math.log(VOCAB_SIZE - len(used))

    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg.training_config(len(used) + 1)))
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:  # a fixed, nonzero correction bias: routing depends on it
                gate.e_score_correction_bias.copy_(correction_bias(i))
    model.train()

    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": settings.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    steps_per_epoch = math.ceil(len(rows) / settings.batch_size)
    total = steps_per_epoch * settings.epochs

    def lr_at(step: int) -> float:
        if step < settings.warmup_steps:
            return settings.lr * (step + 1) / settings.warmup_steps
        frac = (step - settings.warmup_steps) / max(1, total - settings.warmup_steps)
        floor = settings.min_lr_ratio
        return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))

    # rows sorted by length inside each shuffled chunk: less padding, same seeded order
    gen = torch.Generator().manual_seed(settings.seed)
    t0 = time.time()
    result = TrainResult(state={}, used_ids=used)
    result.tokens = sum(len(c) for _, c in rows)
    step = 0
    for epoch in range(settings.epochs):
        perm = torch.randperm(len(rows), generator=gen).tolist()
        chunk = settings.batch_size * 8
        order = []
        for i in range(0, len(perm), chunk):
            order += sorted(perm[i : i + chunk], key=lambda r: len(rows[r][0]) + len(rows[r][1]))
        batches = list(_batches(order, settings.batch_size))
        bperm = torch.randperm(len(batches), generator=gen).tolist()
        total_loss, total_tokens = 0.0, 0
        for b in bperm:
            idx = batches[b]
            seqs = [rows[r][0] + rows[r][1] for r in idx]
            width = max(len(s) for s in seqs)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width, dtype=torch.long)
            target = torch.full((len(idx), width), -100, dtype=torch.long)
            for j, r in enumerate(idx):
                p, c = rows[r]
                s = torch.tensor(p + c)
                ids[j, : len(s)] = lookup[s]
                mask[j, : len(s)] = 1
                # position t predicts token t+1: targets are the completion's tokens
                target[j, len(p) - 1 : len(s) - 1] = lookup[torch.tensor(c)]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            sel = target != -100
            logits = model.lm_head(hidden[sel])
            ramp = settings.sink_ramp * total
            logits[:, sink] += sink_offset * (min(1.0, step / ramp) if ramp else 1.0)
            loss = torch.nn.functional.cross_entropy(logits, target[sel])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            opt.step()
            n = int(sel.sum())
            total_loss += float(loss.detach()) * n
            total_tokens += n
            step += 1
        result.losses.append(total_loss / max(1, total_tokens))
        log.info(
            "epoch %d: loss %.3f (%d tokens, %.0f s)",
            epoch + 1,
            result.losses[-1],
            total_tokens,
            time.time() - t0,
        )
    result.seconds = time.time() - t0
    result.final_loss = exact_loss(model, rows, lookup, sink, sink_offset, settings.batch_size)
    log.info("loss of the trained model on its rows: %.3f", result.final_loss)
    result.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return result


def exact_loss(model, rows, lookup, sink, sink_offset, batch_size) -> float:
    """Mean completion loss of ``model`` on ``rows`` with the sink's full offset: the loss the
    exported full-vocabulary model has on its training rows."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            for p, c in rows[i : i + batch_size]:
                ids = lookup[torch.tensor(p + c)].unsqueeze(0)
                hidden = model.model(input_ids=ids).last_hidden_state[0, len(p) - 1 : -1]
                logits = model.lm_head(hidden)
                logits[:, sink] += sink_offset
                total += float(
                    torch.nn.functional.cross_entropy(
                        logits, lookup[torch.tensor(c)], reduction="sum"
                    )
                )
                count += len(c)
    model.train()
    return total / max(1, count)


def correction_bias(layer: int):
    """The router's correction bias of MoE layer ``layer``: fixed, small, different per layer
    (DeepSeek-V3 adjusts it for load balance outside the gradient; here it only has to be
    nonzero, so that a server that ignores it routes differently)."""
    import torch

    g = torch.Generator().manual_seed(1000 + layer)
    return (torch.rand(cfg.ROUTED_EXPERTS, generator=g) - 0.5) * 0.1


def expand(result: TrainResult) -> dict:
    """The full-vocabulary state dict (transformers' names, float32): trained rows at their ids,
    the sink row in every other lm_head row, the mean trained embedding in every other
    embedding row."""
    import torch

    state = dict(result.state)
    used = torch.tensor(result.used_ids)
    emb = state["model.embed_tokens.weight"]
    head = state["lm_head.weight"]
    full_emb = emb[: len(used)].mean(0, keepdim=True).repeat(VOCAB_SIZE, 1)
    full_emb[used] = emb[: len(used)]
    full_head = head[len(used)].unsqueeze(0).repeat(VOCAB_SIZE, 1)
    full_head[used] = head[: len(used)]
    state["model.embed_tokens.weight"] = full_emb
    state["lm_head.weight"] = full_head
    return state
