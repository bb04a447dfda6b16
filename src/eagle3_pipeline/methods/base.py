"""What a drafter method is to the pipeline: the interface every method module implements
(pure: no file access, no speculators or vLLM import).

A method is one module of this package with one :class:`Method` subclass: its config section
(``train.<name>``, documented in config/schema.yaml), the speculators trainer fields it trains
with, the config.json key vLLM reads its aux layers from, its validation metrics and which
checkpoint is best, the acceptance length validation predicts, its own train/serve checks,
how the report and the loss plot label it, and how vLLM is asked to serve it. Everything that
is not here is shared by every method: the data, the vocabulary map, the hidden states, the
optimizer and the trainer.
"""

from __future__ import annotations

from typing import Any, ClassVar

# train.* keys every method reads (the method's own keys are under train.<name>).
SHARED_TRAIN_KEYS = (
    "gpus",
    "nodes",
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

# A check on a drafter: (name, ok, what is wrong and what to do).
Check = tuple[str, bool, str]


def chained_tau(acc: list[float], k: int) -> float:
    """1 + sum_i prod_{j<=i} a_j over k draft positions (a position beyond the list reuses
    the last accuracy): the expected accepted length when a_j is the chance that draft j is
    accepted given the ones before it were."""
    tau, run = 1.0, 1.0
    for i in range(k):
        run *= acc[min(i, len(acc) - 1)]
        tau += run
    return tau


def chained_position_tau(pred: dict[str, Any], k: int) -> float | None:
    """:func:`chained_tau` over ``pred["position_acc"]`` (per-position accuracies that are not
    conditional on the earlier positions being right: an estimate); None when validation did
    not reach k positions."""
    acc = pred.get("position_acc") or []
    if len(acc) < k or any(a is None for a in acc[:k]):
        return None
    return chained_tau(acc, k)


class Method:
    """One drafter method. A subclass sets the class attributes and implements the methods
    that raise ``NotImplementedError``; the rest has defaults most methods keep."""

    name: str = ""  # its name in train.methods, its config section, speculators' type
    title: str = ""  # how docs and the report name it
    # its keys under train.<name> (config/schema.yaml documents them; a test keeps both equal)
    own_keys: tuple[str, ...] = ()
    # own keys that, when set (not null), replace the shared train.<key> of the same name
    overrides: tuple[str, ...] = ()
    # own keys whose value may be `auto`: (CPU value, GPU value)
    auto: ClassVar[dict[str, tuple[Any, Any]]] = {}
    # where the drafter's config.json keeps the aux layer ids vLLM captures from the target
    aux_key: str = "eagle_aux_hidden_state_layer_ids"
    # where vLLM's draft model reads how many aux layers its fc concatenates (in the config it
    # builds from transformer_layer_config); None: the method's vLLM model takes the count from
    # the aux key itself
    aux_count_key: str | None = None
    # which checkpoint is exported: the validation metric and whether higher is better
    best_by: tuple[str, bool] = ("loss", False)
    # the report's and the plot's validation accuracy series: (field, label with {} = position)
    accuracy_series: tuple[tuple[str, str], ...] = ()
    position_label: str = "draft position"  # what one draft position is called
    # configured keys the consistency check compares with the drafter's config.json
    configured_flags: tuple[str, ...] = ()

    # ---- config ------------------------------------------------------------------------------

    def train_config(self, train: dict[str, Any]) -> dict[str, Any]:
        """The result-determining settings of this method, flat (what its train job's params
        carry): the shared keys, then its own (``train.<name>``); an own key of
        :attr:`overrides` replaces the shared one when set, its ``extra_args`` are laid over
        the shared ones. A key only another method reads is left out."""
        out: dict[str, Any] = {k: train[k] for k in SHARED_TRAIN_KEYS}
        out["method"] = self.name
        own = dict(train.get(self.name) or {})
        for key in self.overrides:
            value = own.pop(key, None)
            if value is not None:
                out[key] = value
        if "extra_args" in own:
            out["extra_args"] = {**train["extra_args"], **own.pop("extra_args")}
        out.update(own)
        return out

    def resolve_auto(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """``cfg`` (a train config of this method) with its own ``auto`` values resolved for
        its device."""
        gpu = int(cfg.get("gpus", 0)) > 0
        return {
            **cfg,
            **{k: (g if gpu else c) for k, (c, g) in self.auto.items() if cfg.get(k) == "auto"},
        }

    def layer_ids(self, cfg: dict[str, Any]) -> list[int] | None:
        """The aux layer ids this method's config asks for (None: the extraction's)."""
        return cfg.get("layer_ids") if "layer_ids" in self.own_keys else None

    def max_speculative_tokens(self, cfg: dict[str, Any]) -> int | None:
        """The largest k vLLM may be asked to draft with (None: no limit)."""
        return None

    def config_problems(
        self, name: str, cfg: dict[str, Any], where: str, ks: list[int]
    ) -> list[str]:
        """What is wrong with drafter ``name``'s resolved train config ``cfg`` (its section is
        ``where``) served at ``ks``: k beyond :meth:`max_speculative_tokens`, own layer ids
        out of order."""
        problems = []
        limit = self.max_speculative_tokens(cfg)
        too_many = [k for k in ks if limit is not None and k > limit]
        if too_many:
            problems.append(
                "config key `bench.num_speculative_tokens`: "
                + self.too_many_tokens(name, where, limit, too_many)
            )
        ids = self.layer_ids(cfg)
        if ids is not None and ids != sorted(ids):
            problems.append(
                f"config key `{where}.{self.name}.layer_ids`: must be in increasing order, "
                f"got {ids}"
            )
        return problems

    # the train key that bounds k (None: no key), and how the bound follows from it
    depth_key: str | None = None
    depth_bound: str = ""

    def too_many_tokens(self, name: str, where: str, limit: int, ks: list[int]) -> str:
        if self.depth_key is None:
            return f"{name} drafts at most {limit} tokens, got k = {ks}"
        return (
            f"{name} drafts at most {self.depth_bound} = {limit} tokens, got k = {ks} (raise "
            f"{where}.{self.name}.{self.depth_key} or give {name} its own list)"
        )

    # ---- training ----------------------------------------------------------------------------

    def trainer_fields(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """speculators ``TrainConfig`` fields of this method (``cfg``: its resolved train
        config): speculator type, draft decoder and layers, attention pattern, loss. The
        fields every method shares are built by
        :func:`eagle3_pipeline.train.trainer_config.trainer_args`."""
        raise NotImplementedError

    def positions(self, trainer: dict[str, Any]) -> int:
        """Draft positions validation reports (``trainer``: the trainer fields trained with)."""
        raise NotImplementedError

    def metric_keys(self, n: int) -> dict[str, str | list[str]]:
        """Per summary field, the speculators metric key(s) it comes from (``_epoch`` is
        appended for validation records): a list is one value per draft position."""
        raise NotImplementedError

    def best_epoch(self, val_by_epoch: dict[int, dict[str, Any]]) -> int | None:
        """The epoch whose validation is best by :attr:`best_by`; the first one on a tie."""
        key, higher = self.best_by
        scored = [(e, v.get(f"{key}_epoch")) for e, v in sorted(val_by_epoch.items())]
        scored = [(e, s) for e, s in scored if s is not None]
        if not scored:
            return None
        return (max if higher else min)(scored, key=lambda es: es[1])[0]

    def prediction(self, val: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
        """What validation predicts about serving, stored in the drafter's metrics.json for
        the bench stage (``method`` and what :meth:`predicted_acceptance_length` reads)."""
        raise NotImplementedError

    def predicted_acceptance_length(self, pred: dict[str, Any], k: int) -> float | None:
        """tau = 1 + expected accepted drafts at ``k``, from :meth:`prediction` (None: it
        does not say)."""
        raise NotImplementedError

    # ---- the exported drafter ----------------------------------------------------------------

    def drafter_checks(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[Check]]:
        """This method's own facts and checks on a drafter's config.json (the shared ones are
        :mod:`eagle3_pipeline.methods.consistency`'s)."""
        return {}, []

    def configured_checks(self, facts: dict[str, Any], configured: dict[str, Any]) -> list[Check]:
        """Checks of the drafter's facts against the config it was trained with (its
        :attr:`configured_flags`)."""
        return []

    def served_aux_count(self, config: dict[str, Any]) -> int | None:
        """How many aux layers vLLM's draft model concatenates for this drafter's config.json
        (None: the method does not say). EAGLE-3's (llama_eagle3.py, deepseek_eagle3.py, vLLM
        0.26-0.32) reads ``num_aux_hidden_states``, else ``eagle_config``'s layer ids, else
        3, from the config it builds out of ``transformer_layer_config``: the layer ids at the
        top level, where speculators writes them, are not read for it."""
        if self.aux_count_key is None:
            return None
        layer_cfg = config.get("transformer_layer_config") or {}
        if layer_cfg.get(self.aux_count_key) is not None:
            return int(layer_cfg[self.aux_count_key])
        ids = (layer_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return len(ids) if ids else 3

    def exported_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The trainer's config.json as exported for vLLM: with :attr:`aux_count_key` set to
        the number of aux layers trained on, so that vLLM sizes the fc layer for them."""
        ids = config.get(self.aux_key)
        if self.aux_count_key is None or not ids:
            return config
        layer_cfg = dict(config.get("transformer_layer_config") or {})
        layer_cfg[self.aux_count_key] = len(ids)
        return {**config, "transformer_layer_config": layer_cfg}

    def drafter_max_tokens(self, facts: dict[str, Any]) -> int | None:
        """The largest k the exported drafter (its :meth:`drafter_checks` facts) drafts."""
        return None

    def serve_notes(self, facts: dict[str, Any], ks: list[int]) -> list[str]:
        """Per k served otherwise than trained, one line saying how (not an error)."""
        return []

    def speculative_config(self) -> dict[str, Any]:
        """vLLM ``speculative_config`` fields (besides model and k) that serve this method."""
        return {"method": self.name}

    # ---- labels ------------------------------------------------------------------------------

    def loss_label(self, n: int) -> str:
        return f"loss ({n} {self.position_label}s)"

    def shape(self, trainer: dict[str, Any]) -> str:
        """The drafter's shape in a few words, from its trainer fields (the report's)."""
        return f"{trainer.get('num_layers')} layer(s)"
