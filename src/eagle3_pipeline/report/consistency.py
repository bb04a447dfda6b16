"""The report's train/serve section: the drafter's config against the extraction and the target
(methods.consistency), and what the served drafter is fed against what it was trained on
(bench.features)."""

from __future__ import annotations

from .cells import fmt as _fmt


def consistency(methods: dict[str, dict]) -> list:
    blocks: list = []
    facts: dict[str, dict] = {}
    for method, m in methods.items():
        cons = m["bench"].get("consistency", {})
        prefix = f"{method}: " if len(methods) > 1 else ""
        blocks.append(
            (
                "banner",
                cons.get("ok", False),
                prefix
                + (
                    "drafter config matches extraction and target"
                    if cons.get("ok")
                    else "; ".join(cons.get("problems", ["not checked"]))
                ),
            )
        )
        for note in m["bench"].get("served_with_shorter_block", []):
            blocks.append(("banner", False, f"{prefix}NOT SERVED AS TRAINED at {note}"))
        blocks.append(_served_features(prefix, m["bench"].get("served_features") or {}))
        facts[method] = cons.get("drafter") or {}
    fields = list(dict.fromkeys(f for fs in facts.values() for f in fs))
    rows = [[f, *(_fmt(facts[m].get(f)) for m in methods)] for f in fields]
    return [*blocks, ("table", ["field", *methods], rows)]


def _served_features(prefix: str, served: dict) -> tuple:
    """The bench job's check of what the served drafter is fed (bench.features)."""
    if not served.get("checked"):
        return ("p", f"{prefix}features at serve time not compared: {served.get('why', '-')}")
    errors = ", ".join(_fmt(e, 4) for e in served["rel_err_per_layer"])
    text = (
        f"{prefix}features the served drafter is fed, against the stored ones (sample "
        f"{served['sample']}, {served['positions']} positions): relative error per aux layer "
        f"{errors} (limit {_fmt(served['limit'])})"
    )
    return (
        "banner",
        bool(served.get("ok")),
        text if served.get("ok") else "TRAIN/SERVE MISMATCH: " + text,
    )
