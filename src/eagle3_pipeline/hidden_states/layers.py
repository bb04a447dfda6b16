"""Which target layers extraction captures: the aux layer ids and the final layer.

One place for the choice, used by extraction and by the plan printed before any job
(``plan``), so kept free of heavy imports. The default ids are the target's
(``target.default_layer_ids``, recorded in target.json).
"""

from __future__ import annotations


class LayerIdError(ValueError):
    """A configured layer id the target does not have."""


def resolve_layers(cfg: dict, arch: dict) -> tuple[list[int], list[int], int]:
    """(aux layer ids, captured aux layer ids, final layer id). The aux ids are
    ``extract.layer_ids`` (or the target's default), the ones every drafter method without
    layers of its own trains on; the captured ones add the layers other methods ask for
    (``method_layer_ids``: one extraction serves them all). The final id N is the last
    layer's output before the final norm; vLLM captures the ids in increasing order, so the
    final one comes last."""
    n = arch["num_layers"]
    aux = list(cfg["layer_ids"] or arch["default_layer_ids"])
    captured = sorted({*aux, *(cfg.get("method_layer_ids") or [])})
    bad = [i for i in captured if not 0 <= i < n]
    if bad:
        raise LayerIdError(
            f"layer ids {bad} (extract.layer_ids, train.<method>.layer_ids) out of range: the "
            f"target has {n} layers (valid ids 0..{n - 1}; the final layer {n} is added "
            "automatically)"
        )
    return aux, captured, n
