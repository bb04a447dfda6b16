"""Train/serve consistency: the drafter checkpoint vLLM will load, checked against the
extraction it was trained on, the target and (in the train stage) the config and vocab map.

None of these slips makes vLLM fail: it verifies every draft, so a mis-wired drafter only gets
fewer tokens accepted, which for a weak drafter is lost in the benchmark's noise
(docs/dependencies.md). They are therefore checked structurally: by the train stage right after
export and by the bench stage before any server starts. Both call :func:`check`; a check whose
inputs a stage does not have is not run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import methods
from ..runtime.files import read_json

_TARGET_WINDOW = object()  # check(): read the target's window from its config


def target_model_window(model_path: str | Path) -> int | None:
    """The sliding window vLLM puts into ``CacheConfig.sliding_window`` for this target
    (vllm/engine/arg_utils.py: only when the target has no ``layer_types`` or slides on every
    layer). Draft layers without a window of their own fall back to it (attention.py)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(model_path))
    text = getattr(cfg, "text_config", None) or cfg
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and not all(t == "sliding_attention" for t in layer_types):
        return None
    window = getattr(text, "sliding_window", None)
    return int(window) if window else None


def trained_windows(layer_cfg: dict[str, Any]) -> list[int | None]:
    """The window speculators trained each draft layer with (eagle3/core.py: layers listed as
    ``sliding_attention`` in ``layer_types`` get ``sliding_window``, the others full)."""
    n = int(layer_cfg.get("num_hidden_layers", 1))
    types = layer_cfg.get("layer_types") or ["full_attention"] * n
    return [layer_cfg.get("sliding_window") if t == "sliding_attention" else None for t in types]


def served_windows(layer_cfg: dict[str, Any], target_window: int | None) -> list[int | None]:
    """The window vLLM applies to each draft layer: llama.py's LlamaAttention passes
    ``config.sliding_window`` for a ``sliding_attention`` entry of ``layer_types`` (indexed
    relative to the draft via ``target_layer_count``), else None, and attention.py then falls
    back to the target's model-wide window."""
    n = int(layer_cfg.get("num_hidden_layers", 1))
    types = layer_cfg.get("layer_types")
    if not types:
        return [target_window] * n
    return [
        layer_cfg.get("sliding_window") if t == "sliding_attention" else target_window
        for t in types
    ]


def drafter_facts(drafter_dir: str | Path) -> dict[str, Any]:
    """What vLLM reads from the drafter checkpoint (config.json, d2t/t2d in the weights)."""
    from safetensors import safe_open

    drafter_dir = Path(drafter_dir)
    cfg = read_json(drafter_dir / "config.json")
    with safe_open(str(drafter_dir / "model.safetensors"), framework="np") as fh:
        keys = set(fh.keys())
        d2t_len = fh.get_slice("d2t").get_shape()[0] if "d2t" in keys else None
        t2d_len = fh.get_slice("t2d").get_shape()[0] if "t2d" in keys else None
        fc_in = fh.get_slice("fc.weight").get_shape()[1] if "fc.weight" in keys else None
    layer_cfg = cfg.get("transformer_layer_config", {})
    verifier = (cfg.get("speculators_config", {}).get("verifier") or {}).get("name_or_path")
    method = cfg.get("speculators_model_type")
    known = method in methods.REGISTRY
    own = methods.REGISTRY[method].drafter_checks(cfg)[0] if known else {}
    served_aux = methods.REGISTRY[method].served_aux_count(cfg) if known else None
    target_hidden = cfg.get("target_hidden_size") or layer_cfg.get("hidden_size")
    served_fc = served_aux * target_hidden if served_aux and target_hidden else None
    return {
        "speculators_model_type": method,
        "architectures": cfg.get("architectures"),
        "aux_layer_key": methods.aux_key(method),
        "aux_layer_ids": cfg.get(methods.aux_key(method)),
        "hidden_size": layer_cfg.get("hidden_size"),
        "vocab_size": layer_cfg.get("vocab_size"),
        "draft_vocab_size": cfg.get("draft_vocab_size"),
        "d2t_len": d2t_len,
        "t2d_len": t2d_len,
        "norm_before_fc": cfg.get("norm_before_fc"),
        "norm_output": cfg.get("norm_output"),
        "fc_input_width": fc_in,
        "served_num_aux_layers": served_aux,
        "served_fc_input_width": served_fc,
        "num_draft_layers": layer_cfg.get("num_hidden_layers"),
        "layer_types": layer_cfg.get("layer_types"),
        "sliding_window": layer_cfg.get("sliding_window"),
        "trained_window_per_layer": trained_windows(layer_cfg),
        "verifier_path": verifier,
        "verifier_path_exists": bool(verifier)
        and Path(verifier).is_absolute()
        and (Path(verifier) / "config.json").is_file(),
        **own,
    }


def _matches_vocab_stage(drafter_dir: Path, facts: dict[str, Any], d2t: Path, t2d: Path) -> bool:
    """The drafter's d2t/t2d are the vocab stage's (or, without a map, the sizes agree)."""
    import numpy as np
    from safetensors import safe_open

    want_d2t, want_t2d = np.load(d2t), np.load(t2d)
    if facts["d2t_len"] is None or facts["t2d_len"] is None:
        return facts["draft_vocab_size"] == len(want_d2t) == facts["vocab_size"]
    with safe_open(str(drafter_dir / "model.safetensors"), framework="np") as fh:
        got_d2t, got_t2d = fh.get_tensor("d2t"), fh.get_tensor("t2d")
    return (
        facts["draft_vocab_size"] == len(want_d2t) == len(got_d2t)
        and got_t2d.shape == want_t2d.shape
        and bool((got_d2t == want_d2t).all())
        and bool((got_t2d == want_t2d).all())
    )


def check(
    drafter_dir: str | Path,
    manifest: dict[str, Any],
    target: dict[str, Any],
    *,
    configured: dict[str, Any] | None = None,
    vocab_map: tuple[str | Path, str | Path] | None = None,
    target_window: int | object | None = _TARGET_WINDOW,
) -> dict[str, Any]:
    """Check the drafter at ``drafter_dir`` against the extraction ``manifest`` and the target
    (``target/target.json``); with ``configured`` (the resolved ``train`` config of the
    drafter's method, with the ``aux_layer_ids`` it trained on) also against the method, layers,
    norm flags and window asked for, with ``vocab_map`` (d2t, t2d paths of the vocab stage) also
    against that map. ``target_window`` defaults to the one read from the target's config.
    Each method's own fields are checked by method (:mod:`eagle3_pipeline.methods`).

    Returns ``{"drafter": facts, "served": ..., "expected": ..., "checks": {name: ok},
    "problems": [what is wrong and what to do], "ok"}``.
    """
    drafter_dir = Path(drafter_dir)
    facts = drafter_facts(drafter_dir)
    method = facts["speculators_model_type"]
    arch = target.get("architecture", {})
    if target_window is _TARGET_WINDOW:
        target_window = target_model_window(target["model_path"])
    layer_cfg = {
        "num_hidden_layers": facts["num_draft_layers"] or 1,
        "layer_types": facts["layer_types"],
        "sliding_window": facts["sliding_window"],
    }
    served = served_windows(layer_cfg, target_window)
    checks: dict[str, bool] = {}
    problems: list[str] = []

    def require(name: str, ok: bool, problem: str) -> None:
        checks[name] = bool(ok)
        if not ok:
            problems.append(problem)

    require(
        "method_known",
        method in methods.METHODS,
        f"drafter is a {method!r} checkpoint; the pipeline trains and serves "
        f"{', '.join(methods.METHODS)}",
    )
    if configured is not None:
        want = methods.of(configured).name
        require(f"is_{want}", method == want, f"drafter is a {method!r} checkpoint, not {want}")
    aux = facts["aux_layer_ids"]
    extracted = list(manifest["layer_ids"])[:-1]
    require(
        "aux_layers_were_extracted",
        aux is not None and set(aux) <= set(extracted),
        f"drafter config has no {facts['aux_layer_key']}: vLLM would fall back to its own "
        "default layers"
        if aux is None
        else f"drafter aux layer ids {aux} were not all extracted (the hidden states hold "
        f"{extracted}): re-train on this extraction",
    )
    if facts["served_num_aux_layers"] is not None:
        require(
            "served_fc_width_as_trained",
            aux is not None
            and facts["served_num_aux_layers"] == len(aux)
            and facts["served_fc_input_width"] == facts["fc_input_width"],
            f"vLLM builds the drafter's fc for {facts['served_num_aux_layers']} aux layers "
            f"(input width {facts['served_fc_input_width']}), it was trained on "
            f"{len(aux or [])} ({aux}, width {facts['fc_input_width']}): vLLM refuses to load "
            "it; re-export it with this version of the pipeline (num_aux_hidden_states)",
        )
    if configured is not None and configured.get("aux_layer_ids") is not None:
        require(
            "aux_layer_ids_as_trained",
            aux is not None and list(aux) == list(configured["aux_layer_ids"]),
            f"drafter aux layer ids {aux} differ from the layers it was trained on "
            f"{configured['aux_layer_ids']}",
        )
    require(
        "final_layer_is_target_last",
        arch.get("num_layers") is None or manifest["final_layer_id"] == arch["num_layers"],
        f"the extraction's final layer {manifest['final_layer_id']} is not the target's last "
        f"layer {arch.get('num_layers')}",
    )
    require(
        "hidden_size_matches",
        facts["hidden_size"] == manifest["hidden_size"],
        f"drafter hidden size {facts['hidden_size']} differs from the extracted hidden states' "
        f"{manifest['hidden_size']}",
    )
    require(
        "vocab_size_matches_target",
        arch.get("vocab_size") is None or facts["vocab_size"] == arch["vocab_size"],
        f"drafter vocab size {facts['vocab_size']} differs from the target's "
        f"{arch.get('vocab_size')}",
    )
    # speculators stores no map for a draft vocabulary as large as the target's
    no_map = facts["d2t_len"] is None and facts["t2d_len"] is None
    require(
        "vocab_map_fits",
        (no_map and facts["draft_vocab_size"] == facts["vocab_size"])
        or (
            facts["d2t_len"] == facts["draft_vocab_size"]
            and facts["t2d_len"] is not None
            and (arch.get("vocab_size") is None or facts["t2d_len"] == arch["vocab_size"])
        ),
        f"d2t has {facts['d2t_len']} entries for a draft vocabulary of "
        f"{facts['draft_vocab_size']}, t2d covers {facts['t2d_len']} target tokens, the target "
        f"has {arch.get('vocab_size')}",
    )
    if vocab_map is not None:
        d2t, t2d = (Path(p) for p in vocab_map)
        require(
            "draft_vocab_matches_vocab_stage",
            _matches_vocab_stage(drafter_dir, facts, d2t, t2d),
            f"the drafter's vocabulary map is not the vocab stage's ({d2t}, {t2d})",
        )
    own = methods.REGISTRY.get(method)
    if own is not None and configured is not None:
        for name, ok, problem in own.configured_checks(facts, configured):
            require(name, ok, problem)
    if own is not None:
        for name, ok, problem in own.drafter_checks(read_json(drafter_dir / "config.json"))[1]:
            require(name, ok, problem)
    if configured is not None:
        require(
            "sliding_window_as_configured",
            all(w == configured.get("sliding_window") for w in facts["trained_window_per_layer"]),
            f"drafter trained windows {facts['trained_window_per_layer']} differ from "
            f"train.sliding_window {configured.get('sliding_window')}",
        )
    require(
        "sliding_window_served_as_trained",
        served == facts["trained_window_per_layer"],
        f"vLLM serves the draft layers with windows {served} (the target's model-wide window is "
        f"{target_window}), they were trained with {facts['trained_window_per_layer']}",
    )
    verifier = facts["verifier_path"]
    require(
        "verifier_is_target",
        facts["verifier_path_exists"]
        and Path(verifier).resolve() == Path(target["model_path"]).resolve(),
        f"drafter verifier path {verifier!r} does not exist: vLLM fails offline "
        "(HFValidationError) when launched from the drafter alone"
        if not facts["verifier_path_exists"]
        else f"drafter verifier {verifier} is not the target {target['model_path']}",
    )
    return {
        "drafter": facts,
        "served": {"target_model_window": target_window, "window_per_layer": served},
        "expected": {
            "extracted_aux_layer_ids": extracted,
            "final_layer_id": manifest["final_layer_id"],
            "manifest_hidden_size": manifest["hidden_size"],
            "storage": manifest.get("storage"),
            "target_num_layers": arch.get("num_layers"),
            "target_vocab_size": arch.get("vocab_size"),
            **(
                {
                    k: configured.get(k)
                    for k in ("method", "aux_layer_ids", "sliding_window")
                    + (own.configured_flags if own is not None else ())
                }
                if configured is not None
                else {}
            ),
        },
        "checks": checks,
        "problems": problems,
        "ok": not problems,
    }
