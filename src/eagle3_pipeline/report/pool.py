"""The report's "Training pool" section: per training source its licence (per licence of its
tasks for an evaluation suite, a non-commercial one marked) and what the pool's
cleaning removed (benchmark prompts, repeats across sources, near-duplicates, prompts that
contain a held-out one), a sample of the removed prompts, and for a source the target wrote
(self_written) its filter counts and a sample of the turns it kept and removed."""

from __future__ import annotations

from .cells import fmt

SHOWN = 3  # removed or kept prompts shown per source and reason


def _cut(text: str, chars: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars] + "…"


def _removed_rows(train: dict) -> list[list[str]]:
    rows = []
    for name, s in train.items():
        shown: dict[str, int] = {}
        for e in s.get("removed_examples") or []:
            reason = e["reason"]
            if shown.get(reason, 0) >= SHOWN:
                continue
            shown[reason] = shown.get(reason, 0) + 1
            why = (
                f"{e['against']} ({e['how']}): {_cut(e['matched'], 80)}"
                if reason == "decontaminated"
                else f"of {e['of']}"
                + (f", similarity {e['similarity']}" if "similarity" in e else "")
            )
            rows.append([name, reason, _cut(e["prompt"]), why])
    return rows


def _written_blocks(name: str, w: dict) -> list:
    gen = w.get("generation") or {}
    blocks: list = [
        (
            "table",
            [f"written by the target: {name}", ""],
            [
                [
                    "conversations x turns",
                    f"{fmt(w['conversations'])} x {w['turns_per_conversation']}",
                ],
                ["turns written / kept", f"{fmt(w['turns_written'])} / {fmt(w['turns_kept'])}"],
                [
                    "removed by the filters",
                    fmt({k: v for k, v in w["removed"].items() if v}) or "0",
                ],
                ["conversations not finished", fmt(w["not_finished"])],
                ["rows (a turn with the turns before it)", fmt(w["rows"])],
                ["completion tokens/s", fmt(gen.get("completion_tokens_per_s"))],
            ],
        )
    ]
    sample = [["kept", _cut(t)] for t in w.get("kept_examples", [])[:SHOWN]]
    sample += [
        [reason, _cut(t)]
        for reason, texts in (w.get("removed_examples") or {}).items()
        for t in texts[:SHOWN]
    ]
    if sample:
        blocks.append(("table", ["written turn", "text"], sample))
    return blocks


def _licence_rows(train: dict) -> list[list[str]]:
    """Per licence of an evaluation suite's tasks: its tasks (named when few), the prompts
    sampled and in the pool, and a non-commercial licence said so."""
    rows = []
    for name, s in train.items():
        for licence, e in (s.get("licences") or {}).items():
            tasks = e["tasks"]
            named = ", ".join(tasks) if len(tasks) <= SHOWN else f"{len(tasks)} tasks"
            rows.append(
                [
                    name,
                    ("NON-COMMERCIAL: " if e["noncommercial"] else "") + licence,
                    named,
                    fmt(e.get("sampled", 0)),
                    fmt(e.get("in_pool")),
                ]
            )
    return rows


def pool_blocks(prompts: dict) -> list:
    """The section's blocks from ``prompts/train.stats.json`` (nothing for one written before
    the pool was cleaned)."""
    train = prompts.get("train") or {}
    if not any("decontaminated" in s for s in train.values()):
        return []
    decon = prompts.get("decontamination") or {}
    blocks: list = [
        (
            "p",
            "Training prompts that contain a benchmark prompt are removed (same words, a run of "
            f"{fmt(decon.get('ngram'))} words, or a shorter benchmark turn whole), checked "
            f"against every turn of each benchmark source ({fmt(decon.get('turns_indexed'))} "
            "turns) and the held-out set; then a prompt that repeats one of an earlier source, "
            "and near-duplicates.",
        ),
        (
            "table",
            [
                "training source",
                "licence",
                "sampled",
                "decontaminated",
                "repeats of another source",
                "near-duplicates",
                "held out",
                "in the pool",
            ],
            [
                [
                    name,
                    "by task, below" if s.get("licences") else s.get("licence") or "–",
                    fmt(s.get("sampled")),
                    fmt(s["decontaminated"]) if s["decontaminated"] else "0",
                    fmt(s["duplicates_across_sources"]),
                    fmt(s["near_duplicates"]),
                    fmt(s.get("heldout", 0)),
                    fmt(s.get("in_pool")),
                ]
                for name, s in train.items()
            ],
        ),
    ]
    licences = _licence_rows(train)
    if licences:
        blocks.append(("table", ["source", "licence", "tasks", "sampled", "in the pool"], licences))
    removed = _removed_rows(train)
    if removed:
        blocks.append(("table", ["source", "removed as", "prompt", "why"], removed))
    for name, s in train.items():
        if s.get("written"):
            blocks += _written_blocks(name, s["written"])
    return blocks
