"""Where synth answers live between jobs: append-only journals keyed by prompt.

Every finished request is appended to a journal as it completes, under a key of its prompt
(its id, which seeds sampling, and its messages), so a killed job loses at most its in-flight
requests and an edited prompt pool costs only its new or changed prompts. The synth stage runs
as ``synth.jobs`` independent jobs (parts); each part writes a journal of its own, and every
part and the gather read all of them::

    <work_dir>/<fingerprint>/journal.part-<k>-of-<n>.jsonl   answers of part k of n (one writer)
    <work_dir>/<fingerprint>/runs.part-<k>-of-<n>.jsonl      what each run of that part generated

The fingerprint holds :data:`ANSWER_FORMAT`, the version of what an answer holds: journals of
another version are another directory, never read. A single ``<work_dir>/journal.jsonl`` (the
layout of versions without parts) is refused.

Answers belong to prompts, not to parts: changing the number of parts asks for none of them
again. The fingerprint (target identity and generation settings) names the directory, so jobs
that run at once never delete each other's work; the gather, which runs alone, removes the
journals of other fingerprints once the merged output is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..runtime.files import AppendLog, stable_hash
from ..staleness.keys import RESULT_KEYS
from .errors import SynthError

log = logging.getLogger(__name__)

# What every answer depends on: the result-determining keys of the merged answers, except
# max_model_len, which only decides which prompts are rejected (recorded per rejection, see
# settled()), and synth.context, which only decides the messages sent: an answer is keyed by
# them (prompt_key), so a first turn, asked alike in either context, is answered once.
JOURNAL_KEYS = tuple(
    k for k in RESULT_KEYS["synth_gather"] if k not in ("vllm.max_model_len", "synth.context")
)
# Bump when a change alters what a journaled answer holds for the same prompt and settings (how
# a request is built or a response is read): every answer is then asked for again.
ANSWER_FORMAT = 1
# Which entry of a prompt counts when there are several: an answer over a rejection over a
# failure; among equals, the later one (journals in a fixed order, lines in file order).
STATUS_RANK = {"ok": 2, "rejected": 1, "failed": 0}
# What only a merged record needs of a journal entry: the token ids, the messages sent, the
# reasoning (and, unless on-policy contexts are built from it, the answer's text). The entries
# held for every prompt at once (a part's start, the gather's walk) leave them out, so that
# 0.4-2M long answers need not fit in memory; AnswerStore.full reads them back one at a time.
RECORD_ONLY = ("messages", "prompt_token_ids", "completion_token_ids", "reasoning")
AT = "at"  # where AnswerStore.read found an entry: (journal path, byte offset of its line)
OLD_LAYOUT_JOURNAL = "journal.jsonl"  # one journal for the whole stage, in the work dir itself
PART_JOURNAL = re.compile(r"journal\.part-(\d+)-of-(\d+)\.jsonl$")


def part_journal_name(part: int, parts: int) -> str:
    return f"journal.part-{part}-of-{parts}.jsonl"


def journal_part(path: Path) -> tuple[int, int]:
    """(part, parts) of a journal :meth:`AnswerStore.journals` lists."""
    found = PART_JOURNAL.search(path.name)
    return int(found[1]), int(found[2])


# A fingerprint directory's name (the store owns these and nothing else in its work dir)
FINGERPRINT_DIR = re.compile(r"[0-9a-f]{16}")


def fingerprint(target: dict, cfg: dict, vllm_cfg: dict) -> str:
    """What every journaled answer depends on (not the prompts: each entry carries its own)."""
    sections = {"synth": cfg, "vllm": vllm_cfg}
    return stable_hash(
        {
            "format": ANSWER_FORMAT,
            "target": target["identity"],
            "settings": {k: sections[k.split(".")[0]][k.split(".")[1]] for k in JOURNAL_KEYS},
        }
    )


def prompt_key(prompt: dict) -> str:
    """An answer's key: the prompt's id (it seeds sampling) and messages."""
    return stable_hash({"id": prompt["id"], "messages": prompt["messages"]})


def part_of(prompt_id: str, parts: int) -> int:
    """The part (of ``parts``) that answers prompt ``prompt_id``: by a hash of the id, so
    parts stay balanced and a prompt keeps its part when others are added."""
    return int(hashlib.sha256(prompt_id.encode()).hexdigest()[:8], 16) % parts


def entry_key(prompt: dict) -> tuple[str, str]:
    """Where a prompt's entries are found: its id and :func:`prompt_key`."""
    return prompt["id"], prompt_key(prompt)


def best_entries(entries: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (prompt id, key), the entry that counts: an answer over a rejection over a failure,
    the later of equals."""
    out: dict[tuple[str, str], dict] = {}
    for e in entries:
        if e.get("key") is None:
            continue
        held = out.get((e["id"], e["key"]))
        if held is None or STATUS_RANK.get(e["status"], 0) >= STATUS_RANK.get(held["status"], 0):
            out[e["id"], e["key"]] = e
    return out


def current(entries: list[dict], prompts: list[dict]) -> dict[str, dict]:
    """Per prompt id, the entry that counts among those made for the prompt as it is now (an
    entry for an earlier version of an edited prompt does not count): an answer over a
    rejection over a failure, the later of equals."""
    best = best_entries(entries)
    found = ((p["id"], best.get(entry_key(p))) for p in prompts)
    return {pid: e for pid, e in found if e is not None}


def is_settled(entry: dict, max_model_len: int) -> bool:
    """Needs no new request: an answer, or a rejection made under the same ``max_model_len``
    (a longer context may accept the prompt)."""
    return entry["status"] == "ok" or (
        entry["status"] == "rejected" and entry.get("max_model_len") == max_model_len
    )


def settled(entries: list[dict], prompts: list[dict], max_model_len: int) -> dict[str, dict]:
    """Entries that need no new request (:func:`is_settled`)."""
    return {pid: e for pid, e in current(entries, prompts).items() if is_settled(e, max_model_len)}


class AnswerStore:
    """The journals of one fingerprint under ``work_dir``."""

    def __init__(self, work_dir: str | Path, fp: str):
        self.work_dir = Path(work_dir)
        self.fingerprint = fp
        self.dir = self.work_dir / fp[:16]
        old = self.work_dir / OLD_LAYOUT_JOURNAL
        if old.exists():
            raise SynthError(
                f"{old}: answers journaled by an older version of the pipeline (one journal "
                "for the whole stage), which this version does not read. Delete it (with "
                "runs.jsonl and fingerprint.json beside it) and run synth again: its prompts "
                "are asked again."
            )

    def journals(self) -> list[Path]:
        """Every journal of this fingerprint, in the fixed order entries are read in."""
        return sorted(self.dir.glob("journal.*.jsonl"))

    def read(self, content: bool = False) -> list[dict]:
        """Every complete entry of every journal (a torn last line is left out), without what
        only a record needs (:data:`RECORD_ONLY`; the answer's ``content`` too unless asked
        for), each with where it lies (:data:`AT`) for :meth:`full`."""
        drop = set(RECORD_ONLY) | (set() if content else {"content"})
        out = []
        for path in self.journals():
            where = str(path)
            for start, _, entry in AppendLog(path).records():
                for k in drop & entry.keys():
                    del entry[k]
                entry[AT] = (where, start)
                out.append(entry)
        return out

    def full(self, entries: Iterable[dict]) -> Iterator[dict]:
        """The whole journal entry of each of ``entries`` (as :meth:`read` gives them), in
        their order, read from its journal one at a time."""
        with contextlib.ExitStack() as stack:
            files: dict[str, Any] = {}
            for entry in entries:
                path, start = entry[AT]
                if path not in files:
                    files[path] = stack.enter_context(open(path, "rb"))
                fh = files[path]
                fh.seek(start)
                yield json.loads(fh.readline())

    def journal(self, part: int, parts: int) -> AppendLog:
        """Part ``part`` of ``parts``'s own journal, opened for appending."""
        log_ = AppendLog(self.dir / part_journal_name(part, parts))
        log_.open()
        return log_

    def record_run(self, part: int, parts: int, run: dict) -> None:
        """What one run of a part generated (for the stage's generation rate)."""
        runs = AppendLog(self.dir / f"runs.part-{part}-of-{parts}.jsonl")
        runs.open()
        runs.append(run)
        runs.close()

    def runs(self) -> list[dict]:
        paths = sorted(self.dir.glob("runs.*.jsonl"))
        return [r for path in paths for r in AppendLog(path).read()]

    def discard_others(self) -> None:
        """Remove the journals of other fingerprints (another target or other generation
        settings): called once the merged output of this one is written. Other files in the
        work dir (a one-process run's part manifests) are not the store's and stay."""
        if not self.work_dir.is_dir():
            return
        for path in self.work_dir.iterdir():
            if path != self.dir and path.is_dir() and FINGERPRINT_DIR.fullmatch(path.name):
                log.info("synth: discarding answers of other settings in %s", path)
                shutil.rmtree(path)
