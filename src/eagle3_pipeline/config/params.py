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
            # (in stored mode they are the extract job's, and its manifest is train's input)
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
            node[name] = bench_chat_template_kwargs(cfg)  # resolved: null follows synth's
        elif key == "bench.gate":
            # only the floors that judge this drafter: another drafter's re-judge nothing here
            node[name] = {"floors": copy.deepcopy(floors_for(cfg["bench"]["gate"], method))}
        else:
            node[name] = copy.deepcopy(_lookup(cfg, key))
    if rule == "extract":
        # the layers a method asks for beyond extract.layer_ids: extraction captures them too
        out["extract"]["method_layer_ids"] = methods.extra_layer_ids(cfg["train"])
    return out
