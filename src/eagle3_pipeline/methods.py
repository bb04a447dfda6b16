"""Drafter methods: what each trains with, EAGLE-3 and DFlash (pure: no file access, no
speculators or vLLM import). What their training reports and how their drafters are served
and checked: :mod:`eagle3_pipeline.method_results`. The training fingerprint covers this module
only, so an edit to how results are read re-exports without retraining.

Both methods train with speculators 0.9's trainer on the same data: the prepared rows, the
draft vocabulary map and hidden-state files of aux layers + the target's final layer. What
differs (speculators ``train/config/schema.py``, ``models/dflash/``; vLLM
``transformers_utils/configs/speculators/algos.py``, ``model_executor/models/qwen3_dflash.py``;
docs/methods.md):

* **eagle3** - an autoregressive one-layer Llama head, trained with TTT steps; vLLM drafts k
  tokens one after another. Its aux layer ids are stored as
  ``eagle_aux_hidden_state_layer_ids``; ``norm_before_fc`` / ``norm_output`` are its own.
* **dflash** - a block drafter: Qwen3 decoder layers that draft a whole block of
  ``block_size - 1`` tokens in one non-causal forward pass from the anchor token and mask
  tokens, conditioned on the target's aux hidden states (``aux_hidden_state_layer_ids``). It
  needs a ``mask_token_id``, is served with ``k <= block_size - 1``, and its attention inside a
  block must be served as trained: vLLM applies ``causal = not sliding_window_non_causal`` to
  every draft layer, while speculators trains full-attention layers bidirectionally whatever
  that flag says, so with full attention (``train.sliding_window: null``) the flag must be
  true. Validation reports per-position accuracies and ``eal`` (expected accepted length over
  the block); the best checkpoint is the one with the highest ``eal`` (lowest validation loss
  and acceptance do not move together under CE + D-PACE).

A run may also train **variants** of a method on the same data (``train.variants``: a name, its
method and the ``train`` keys it sets differently, e.g. DFlash at another block size). A
variant is listed in ``train.methods`` by its name and is, everywhere after config validation,
a drafter like the others: its own train and bench jobs, paths and report column, its own
settings (:func:`resolve`).
"""

from __future__ import annotations

from typing import Any

METHODS = ("eagle3", "dflash")

# train.* keys every method uses (the rest of train.* is EAGLE-3's, or operational).
COMMON_TRAIN_KEYS = (
    "gpus",
    "fsdp",
    "epochs",
    "lr",
    "optimizer",
    "scheduler",
    "warmup_ratio",
    "total_seq_len",
    "attn_impl",
    "sliding_window",
    "val_fraction",
    "hidden_states_dtype",
    "loss_implementation",
    "seed",
    "extra_args",
)
# train.* keys only EAGLE-3 reads (train.dflash holds DFlash's own).
EAGLE3_TRAIN_KEYS = ("ttt_steps", "num_layers", "norm_before_fc", "norm_output")
# train.dflash keys that override the shared value of the same name when set.
DFLASH_OVERRIDES = ("epochs", "lr")
# DFlash's `auto` values: (CPU, GPU). The GPU values are speculators' defaults; the CPU ones
# keep a step small enough for a 2-core machine (queries per step = anchors x block).
DFLASH_AUTO = {"block_size": (8, 16), "max_anchors": (128, 512)}
# speculators' DFlash recipe (cross-entropy with D-PACE position weights): fixed here so that
# the job file and the training fingerprint say what DFlash trains with (train.dflash.extra_args
# may still override them).
DFLASH_LOSS = {"loss_fn": "ce", "per_position_loss_weight": "dpace"}


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` laid over it, mappings merged key by key (neither is
    changed)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def resolve(train: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    """The method of drafter ``name`` (a method, or a variant of ``train.variants``) and the
    ``train`` section it trains with: for a variant, its keys laid over the shared ones."""
    if name in METHODS:
        return name, train
    variants = train.get("variants") or {}
    if name not in variants:
        raise ValueError(
            f"unknown drafter {name!r}: neither a method ({', '.join(METHODS)}) nor a "
            f"variant of train.variants ({', '.join(variants) or 'none defined'})"
        )
    own = {k: v for k, v in variants[name].items() if k != "method"}
    return variants[name]["method"], merged(train, own)


def method_of(train: dict[str, Any], name: str) -> str:
    """The method (eagle3, dflash) of drafter ``name``."""
    return resolve(train, name)[0]


def method_train_config(train: dict[str, Any], name: str) -> dict[str, Any]:
    """The result-determining ``train`` settings of one drafter (a method or a variant), flat
    (what its train job's params carry): the shared keys, then the method's own. A key only
    another method reads is left out, so changing it does not re-run this drafter's
    training."""
    method, train = resolve(train, name)
    out: dict[str, Any] = {k: train[k] for k in COMMON_TRAIN_KEYS}
    out["method"] = method
    if method == "eagle3":
        out.update({k: train[k] for k in EAGLE3_TRAIN_KEYS})
        return out
    own = dict(train["dflash"])
    for key in DFLASH_OVERRIDES:
        value = own.pop(key, None)
        if value is not None:
            out[key] = value
    out["extra_args"] = {**train["extra_args"], **own.pop("extra_args", {})}
    out.update(own)
    return out


def resolve_dflash_auto(cfg: dict[str, Any]) -> dict[str, Any]:
    """DFlash's ``auto`` values (block size, anchors) for the config's device."""
    gpu = int(cfg.get("gpus", 0)) > 0
    return {
        **cfg,
        **{
            k: (gpu_v if gpu else cpu_v)
            for k, (cpu_v, gpu_v) in DFLASH_AUTO.items()
            if cfg[k] == "auto"
        },
    }


def max_speculative_tokens(name: str, train_cfg: dict[str, Any]) -> int | None:
    """The largest k vLLM may be asked to draft with drafter ``name`` (None: no limit). A
    DFlash drafter drafts at most block_size - 1 tokens (the anchor slot is the bonus token);
    vLLM does not check it."""
    cfg = method_train_config(train_cfg, name)
    if cfg["method"] != "dflash":
        return None
    return int(resolve_dflash_auto(cfg)["block_size"]) - 1


def layer_ids_of(method_cfg: dict[str, Any]) -> list[int] | None:
    """The aux layer ids a method's config asks for (None = the extraction's shared ones)."""
    return method_cfg.get("layer_ids") if method_cfg.get("method") == "dflash" else None


def extra_layer_ids(train: dict[str, Any]) -> list[int]:
    """Layers some configured drafter asks for beyond ``extract.layer_ids``: extraction
    captures their union once (none for the default config, whose extraction is unchanged)."""
    ids: set[int] = set()
    for name in train["methods"]:
        ids |= set(layer_ids_of(method_train_config(train, name)) or [])
    return sorted(ids)


# ---- speculators TrainConfig fields ---------------------------------------------------------


def method_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """speculators ``TrainConfig`` fields of the method of ``cfg`` (its resolved train config):
    speculator type, draft decoder and layers, attention pattern, loss. The fields every method
    shares (data, vocab map, layer ids, optimizer, trainer) are built by
    :func:`eagle3_pipeline.train.trainer_config.trainer_args`."""
    full_attention = cfg.get("sliding_window") is None
    if cfg.get("method", "eagle3") == "eagle3":
        n = int(cfg["num_layers"])
        return {
            "speculator_type": "eagle3",
            "draft_arch": "llama",
            "num_layers": n,
            "norm_before_fc": bool(cfg["norm_before_fc"]),
            "norm_output": bool(cfg["norm_output"]),
            # speculators' default is a 2048 window on every draft layer; null means full
            # attention on every layer (the unused sliding_window keeps speculators' default)
            "full_attention_indices": list(range(n)) if full_attention else [],
            "ttt_steps": int(cfg["ttt_steps"]),
        }
    c = resolve_dflash_auto(cfg)
    n = int(c["num_layers"])
    fields = {
        "speculator_type": "dflash",
        "draft_arch": "qwen3",
        "num_layers": n,
        "full_attention_indices": list(range(n)) if full_attention else [],
        # speculators trains full-attention layers non-causally; vLLM serves every layer
        # causally unless this flag is set (module docstring)
        "sliding_window_non_causal": full_attention,
        "block_size": int(c["block_size"]),
        "max_anchors": int(c["max_anchors"]),
        **DFLASH_LOSS,
    }
    if c.get("mask_token_id") is not None:
        fields["mask_token_id"] = int(c["mask_token_id"])
    return fields
