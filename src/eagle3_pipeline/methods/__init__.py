"""Drafter methods: one module each (:mod:`.eagle3`, :mod:`.dflash`, :mod:`.peagle`), all
alike behind :class:`.base.Method`; this registry is how the rest of the pipeline reaches
them. Adding a method is one module plus its config section in config/schema.yaml.

A run may also train **variants** of a method on the same data (``train.variants``: a name, its
method and the ``train`` keys it sets differently, e.g. DFlash at another block size). A
variant is listed in ``train.methods`` by its name and is, everywhere after config validation,
a drafter like the others: its own train and bench jobs, paths and report column, its own
settings (:func:`resolve`).
"""

from __future__ import annotations

from typing import Any

from . import dflash, eagle3, peagle
from .base import SHARED_TRAIN_KEYS, Method

REGISTRY: dict[str, Method] = {m.name: m for m in (eagle3.METHOD, dflash.METHOD, peagle.METHOD)}
METHODS = tuple(REGISTRY)
# The method of a drafter whose metrics or config do not say (files of older runs).
DEFAULT = eagle3.METHOD.name

__all__ = ["METHODS", "REGISTRY", "SHARED_TRAIN_KEYS", "Method", "get"]


def get(name: str | None) -> Method:
    """The method called ``name`` (the default method for None)."""
    if name is None:
        return REGISTRY[DEFAULT]
    if name not in REGISTRY:
        raise ValueError(f"unknown drafter method {name!r} (methods: {', '.join(METHODS)})")
    return REGISTRY[name]


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
    if name in REGISTRY:
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
    """The method of drafter ``name``."""
    return resolve(train, name)[0]


def method_train_config(train: dict[str, Any], name: str) -> dict[str, Any]:
    """The result-determining ``train`` settings of one drafter (a method or a variant), flat
    (what its train job's params carry): :meth:`.base.Method.train_config`."""
    method, section = resolve(train, name)
    return REGISTRY[method].train_config(section)


def of(cfg: dict[str, Any]) -> Method:
    """The method of a resolved train config, metrics or prediction (its ``method`` key)."""
    return get(cfg.get("method"))


def max_speculative_tokens(name: str, train: dict[str, Any]) -> int | None:
    """The largest k vLLM may be asked to draft with drafter ``name`` (None: no limit)."""
    cfg = method_train_config(train, name)
    return of(cfg).max_speculative_tokens(cfg)


def layer_ids_of(cfg: dict[str, Any]) -> list[int] | None:
    """The aux layer ids a drafter's train config asks for (None = the extraction's)."""
    return of(cfg).layer_ids(cfg)


def extra_layer_ids(train: dict[str, Any]) -> list[int]:
    """Layers some configured drafter asks for beyond ``extract.layer_ids``: extraction
    captures their union once (none for the default config, whose extraction is unchanged)."""
    ids: set[int] = set()
    for name in train["methods"]:
        ids |= set(layer_ids_of(method_train_config(train, name)) or [])
    return sorted(ids)


def trainer_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """speculators ``TrainConfig`` fields of the method of ``cfg`` (its resolved train
    config)."""
    return of(cfg).trainer_fields(cfg)


def predicted_acceptance_length(pred: dict[str, Any], k: int) -> float | None:
    """tau at ``k`` that training validation predicts (``pred``: a drafter's prediction)."""
    return of(pred).predicted_acceptance_length(pred, k)


def aux_key(method: str | None) -> str:
    """The aux layer ids' key in a ``method`` drafter's config.json (the default method's if
    unknown)."""
    return REGISTRY.get(method or DEFAULT, REGISTRY[DEFAULT]).aux_key
