"""A rule's params: the result-determining part of the config (:func:`result_config`, the keys
of :data:`eagle3_pipeline.staleness.keys.RESULT_KEYS`), in an order that does not depend on how
the config was written (:func:`sort_keys`)."""

from __future__ import annotations

import copy
from typing import Any

from .. import methods
from ..bench.gate import floors_for
from ..bench.settings import bench_chat_template_kwargs, speculative_tokens
from ..prompts.sources import bench_set_spec, source_name
from ..self_written.stage import ANSWER_KEYS, WRITE_KEYS
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


def decontamination_sources(cfg: dict) -> list[dict]:
    """The sources the training pool is decontaminated against: each prompts.bench set's
    source (its kind and file), once, without what only samples a set (n, name, turns); not
    a set marked ``trained_on`` (meant to be in the pool)."""
    found = {
        (s["source"], s.get("path")) for s in cfg["prompts"]["bench"] if not s.get("trained_on")
    }
    return [{"source": k, "path": p} for k, p in sorted(found, key=lambda kp: (kp[0], kp[1] or ""))]


def self_written_names(cfg: dict) -> list[str]:
    """The names of the prompts.train sources the target writes (source self_written)."""
    return [source_name(s) for s in cfg["prompts"]["train"] if s["source"] == "self_written"]


def self_written_spec(cfg: dict, name: str) -> dict:
    """The prompts.train entry of the self_written source ``name``."""
    for spec in cfg["prompts"]["train"]:
        if spec["source"] == "self_written" and source_name(spec) == name:
            return spec
    raise KeyError(f"no self_written source {name!r} in prompts.train")


def result_config(
    cfg: dict,
    rule: str,
    bench_set: str | None = None,
    method: str | None = None,
    written: str | None = None,
) -> dict:
    """The result-determining part of the config for ``rule``, as nested sections
    (``{"synth": {"max_tokens": ...}, "vllm": {...}}``): the rule's ``params``. For
    ``prompts_bench``, ``prompts.bench`` holds only the entry of ``bench_set``; for
    ``prompts_train``, ``prompts.decontaminate_against`` the benchmark sources; for
    ``prompts_write`` and its gather, ``prompts.write`` the writing keys of the self_written
    source ``written`` (and ``synth`` the answer keys, where it writes several turns); for
    ``train``, ``train`` holds the keys ``method`` reads (flat, its own over the shared ones); for
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
    if rule == "prompts_train":
        out["prompts"]["decontaminate_against"] = decontamination_sources(cfg)
        sort_keys(out["prompts"])
    if rule in ("prompts_write", "prompts_write_gather"):
        spec = self_written_spec(cfg, written)
        out["prompts"]["write"] = {k: copy.deepcopy(spec[k]) for k in WRITE_KEYS}
        if spec["turns"] > 1:
            out["synth"].update({k: copy.deepcopy(cfg["synth"][k]) for k in ANSWER_KEYS})
        sort_keys(out)
    return out
