"""A rule's params: the result-determining part of the config (:func:`result_config`, the keys
of :data:`eagle3_pipeline.staleness.keys.RESULT_KEYS`), in an order that does not depend on how
the config was written (:func:`sort_keys`)."""

from __future__ import annotations

import copy
from typing import Any

from .. import methods
from ..bench.gate import floors_for
from ..bench.settings import bench_chat_template_kwargs, speculative_tokens
from ..prompts.sources import bench_set_spec
from ..staleness.keys import ONLINE_EXTRACTION_KEYS, RESULT_KEYS


def sort_keys(value: Any) -> Any:
    """Sort every mapping's keys, in place (lists keep their order).

    Snakemake decides "Params have changed" by comparing the repr of each param, and a config
    section's repr depends on key order: the same values given through ``--config`` (which puts
    the given keys first) or a reordered file would re-run finished stages. Sorted keys make a
    section's repr depend on its values only.
    """
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        value.clear()
        value.update((k, sort_keys(v)) for k, v in items)
    elif isinstance(value, list):
        for item in value:
            sort_keys(item)
    return value


def _lookup(cfg: dict, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = value[part]
    return value


def result_config(
    cfg: dict, rule: str, bench_set: str | None = None, method: str | None = None
) -> dict:
    """The result-determining part of the config for ``rule``, as nested sections
    (``{"synth": {"max_tokens": ...}, "vllm": {...}}``): the rule's ``params``. For
    ``prompts_bench``, ``prompts.bench`` holds only the entry of ``bench_set``; for ``train``,
    ``train`` holds the keys ``method`` reads (flat, its own over the shared ones); for
    ``bench``, ``bench.num_speculative_tokens`` is the list of ``method`` and ``bench.gate``
    holds the floors that judge it."""
    if rule == "train":
        own = methods.method_train_config(cfg["train"], method)
        out = {"train": sort_keys(copy.deepcopy(own))}
        if cfg["extract"]["mode"] != "stored":
            # the train job extracts its hidden states: extraction's result keys are its own
            # (absent in stored mode, so a stored run keeps the params it had)
            for key in ONLINE_EXTRACTION_KEYS:
                if key == "extract.layer_ids" and methods.layer_ids_of(own) is not None:
                    continue
                section, name = key.split(".")
                out.setdefault(section, {})[name] = copy.deepcopy(_lookup(cfg, key))
        return out
    out: dict = {}
    for key in sorted(RESULT_KEYS[rule]):
        *sections, name = key.split(".")
        node = out
        for s in sections:
            node = node.setdefault(s, {})
        if key == "prompts.bench":
            node[name] = [copy.deepcopy(bench_set_spec(cfg, bench_set))]
        elif key == "bench.num_speculative_tokens":
            node[name] = speculative_tokens(cfg, method)
        elif key == "bench.chat_template_kwargs":
            # resolved (null follows synth); absent when empty, so a config without template
            # variables keeps the params it had
            if bench_chat_template_kwargs(cfg):
                node[name] = bench_chat_template_kwargs(cfg)
        elif key == "synth.context":
            # absent at its default (the prompt source's own turns), so a run from before the
            # key keeps its params
            if cfg["synth"]["context"] != "dataset":
                node[name] = cfg["synth"]["context"]
        elif key == "bench.gate":
            # the floors that judge this drafter, absent when none (a run without a gate keeps
            # its params)
            if floors_for(cfg["bench"]["gate"], method):
                node[name] = {"floors": copy.deepcopy(floors_for(cfg["bench"]["gate"], method))}
        elif key == "bench.speculative_config":
            # absent when empty, as chat_template_kwargs: older runs keep their params
            if cfg["bench"]["speculative_config"]:
                node[name] = copy.deepcopy(cfg["bench"]["speculative_config"])
        else:
            node[name] = copy.deepcopy(_lookup(cfg, key))
    if rule == "extract" and methods.extra_layer_ids(cfg["train"]):
        # layers a method asks for beyond extract.layer_ids (absent when there are none, so
        # the default config's extraction params are what they were)
        out["extract"]["method_layer_ids"] = methods.extra_layer_ids(cfg["train"])
    return out
