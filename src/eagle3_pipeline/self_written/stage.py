"""Rules ``prompts_write`` (one job per part) and ``prompts_write_gather``: a ``self_written``
source's conversations written by the target on vLLM servers as synth runs them, then the kept
turns as prompt rows.

A part (:func:`run_part`) writes the conversations :func:`..synth.answers.part_of` gives it, on
the servers synth would start (``synth.endpoint``, ``synth.servers_per_gpu``,
``synth.concurrency``), journaling every step as it arrives in an answer store of its own
(``prompts/self_written/<name>/.partial/<fingerprint>/``): a killed job loses at most its
requests in flight, more ``writes`` ask only for the new conversations, and other settings are
another fingerprint. The gather (:func:`gather`) reads every journal, walks each conversation,
and writes the rows of its kept turns in conversation order, whatever the number of parts,
with the counts of what was written and removed, by reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from ..runtime import Progress, StageClock
from ..runtime.files import stable_hash, write_json, write_jsonl
from ..runtime.provenance import provenance
from ..runtime.results import WRITE_PART, format_tag, read_result
from ..server import ServerError
from ..stats import percentiles
from ..synth.answers import AnswerStore, best_entries, entry_key, is_settled, part_of
from ..synth.check import parser_markers
from ..synth.client import open_endpoints
from ..synth.errors import SynthError
from ..target.chat import load_tokenizer
from ..target.stage import chat_template_text, load_info
from .client import generate, writer
from .conversations import conversations, rows, walk
from .filters import REASONS

log = logging.getLogger(__name__)

# Bump when a change alters what a journaled step holds for the same step and settings.
WRITE_FORMAT = 1
# The keys of a self_written source that decide what its target writes (its params; `n`
# only samples the rows, `name` names the outputs)
WRITE_KEYS = ("writes", "turns", "temperature", "top_p", "max_tokens", "system_prompts", "topics")
# synth's keys that decide an answer between two written turns (turns > 1 only)
ANSWER_KEYS = ("max_tokens", "temperature", "top_p", "seed", "reasoning_parser")
EXAMPLES = 10  # kept rows, and removed turns per reason, shown in the stats and the report


def fingerprint(target: dict, spec: dict, seed: int, synth_cfg: dict, vllm_cfg: dict) -> str:
    """What every journaled step of a source depends on, besides its own messages."""
    answers = {k: synth_cfg[k] for k in ANSWER_KEYS} if spec["turns"] > 1 else None
    return stable_hash(
        {
            "format": WRITE_FORMAT,
            "target": target["identity"],
            "write": {k: spec[k] for k in ("temperature", "top_p", "max_tokens")},
            "seed": seed,
            "chat_template_kwargs": synth_cfg.get("chat_template_kwargs") or {},
            "answers": answers,
            "vllm": {k: vllm_cfg[k] for k in ("device", "dtype")},
        }
    )


def write_settings(spec: dict, seed: int, synth_cfg: dict) -> dict:
    """What a write request reads: the source's sampling, the seed, synth's client settings."""
    return {
        **synth_cfg,
        "max_tokens": spec["max_tokens"],
        "temperature": spec["temperature"],
        "top_p": spec["top_p"],
        "seed": seed,
    }


def thinking_markers(target: dict, synth_cfg: dict, tokenizer) -> tuple:
    """The markers of the target's reasoning parser (none without one): a written turn that
    holds one carries reasoning."""
    if not synth_cfg.get("reasoning_parser"):
        return ()
    m = parser_markers(synth_cfg["reasoning_parser"], tokenizer)
    return (m.start, m.end)


def _known(entries: list[dict], max_model_len: int) -> dict:
    return {k: e for k, e in best_entries(entries).items() if is_settled(e, max_model_len)}


def _record_run(store: AnswerStore, part: int, parts: int, outcome: Counter, times: dict):
    """The run's requests, tokens and times in the store (the gather's generation rate: its
    ``elapsed_s`` starts when the server answered)."""
    if outcome:
        asked = outcome["ok"] + outcome["rejected"] + outcome["failed"]
        tokens = outcome["completion_tokens"]
        run = {"requests": asked, "completion_tokens": tokens, **times}
        store.record_run(part, parts, run)


def run_part(
    target_json,
    part_out,
    part: int,
    parts: int,
    spec: dict,
    seed: int,
    synth_cfg: dict,
    vllm_cfg: dict,
    work_dir,
    log_path=None,
) -> dict:
    """Rule ``prompts_write``: write the conversations of part ``part`` of ``parts`` that are
    not done yet, then the part's manifest (last, atomically)."""
    target = load_info(target_json)
    tokenizer = load_tokenizer(target)
    markers = thinking_markers(target, synth_cfg, tokenizer)
    store = AnswerStore(work_dir, fingerprint(target, spec, seed, synth_cfg, vllm_cfg))
    max_model_len = vllm_cfg["max_model_len"]
    mine = [c for c in conversations(spec, seed) if part_of(c.id, parts) == part]
    known = _known(store.read(content=True), max_model_len)
    entry_of = lambda step: known.get(entry_key(step))  # noqa: E731
    todo = [c for c in mine if walk(c, entry_of, markers).next is not None]
    steps = len(mine) * (2 * spec["turns"] - 1)
    log.info(
        "prompts_write %s part %d of %d: %d of %d conversations (%d turns each), %d to write",
        spec.get("name") or spec["source"],
        part,
        parts,
        len(mine),
        spec["writes"],
        spec["turns"],
        len(todo),
    )
    journal = store.journal(part, parts)
    outcome: Counter = Counter()
    clock = StageClock()
    try:
        if todo:
            request = writer(
                tokenizer, synth_cfg.get("chat_template_kwargs") or {}, chat_template_text(target)
            )
            with open_endpoints(synth_cfg, vllm_cfg, target, log_path) as endpoints:
                clock.ready()
                progress = Progress(
                    steps, f"prompts_write part {part}", unit="requests", done=steps - len(todo)
                )
                outcome = asyncio.run(
                    generate(
                        endpoints,
                        todo,
                        write_settings(spec, seed, synth_cfg),
                        synth_cfg,
                        request,
                        journal,
                        progress,
                        known,
                        max_model_len,
                        markers,
                    )
                )
    except ServerError as e:
        raise SynthError(
            f"the vLLM server died mid-run; the steps written so far are kept in {store.dir} "
            f"and a re-run resumes from them.\n{e}"
        ) from e
    finally:
        journal.close()
    times = clock.split()
    _record_run(store, part, parts, outcome, times)
    manifest = {
        "format": format_tag(WRITE_PART),
        "part": part,
        "parts": parts,
        "conversations": len(mine),
        "fingerprint": store.fingerprint,
        "this_run": {
            "server_started": bool(todo) and not synth_cfg["endpoint"],
            "conversations_written": len(todo),
            **{k: outcome[k] for k in ("ok", "rejected", "failed", "completion_tokens")},
            **times,
        },
        "provenance": provenance({"source": spec, "seed": seed}),
    }
    write_json(part_out, manifest)
    return manifest


def gather(
    target_json,
    part_manifests,
    rows_out,
    stats_out,
    spec: dict,
    seed: int,
    synth_cfg: dict,
    vllm_cfg: dict,
    work_dir,
) -> dict:
    """Rule ``prompts_write_gather``: the rows of every conversation's kept turns, in
    conversation order, and the counts of what was written and removed."""
    target = load_info(target_json)
    tokenizer = load_tokenizer(target)
    markers = thinking_markers(target, synth_cfg, tokenizer)
    store = AnswerStore(work_dir, fingerprint(target, spec, seed, synth_cfg, vllm_cfg))
    parts = [read_result(p, WRITE_PART) for p in part_manifests]
    stale = [p["part"] for p in parts if p.get("fingerprint") != store.fingerprint]
    if stale or {p["parts"] for p in parts} != {len(parts)}:
        raise SynthError(
            f"the prompts_write parts {stale or [p['part'] for p in parts]} were written for "
            "other settings or another number of parts: re-run them (snakemake -R prompts_write)"
        )
    entries = store.read(content=True)
    known = _known(entries, vllm_cfg["max_model_len"])
    entry_of = lambda step: known.get(entry_key(step))  # noqa: E731
    out_rows: list[dict] = []
    removed: Counter = Counter()
    stopped: Counter = Counter()
    examples: dict[str, list[str]] = {}
    lengths = []
    missing = 0
    for conv in conversations(spec, seed):
        w = walk(conv, entry_of, markers)
        if w.next is not None:
            missing += 1
        if w.stopped:
            stopped[w.stopped] += 1
        for text, why in w.written:
            if why:
                removed[why] += 1
                shown = examples.setdefault(why, [])
                if len(shown) < EXAMPLES:
                    shown.append(text[:300])
            else:
                lengths.append(len(text))
        out_rows += rows(conv, w)
    if missing > spec["writes"] * synth_cfg["max_failed_fraction"]:
        raise SynthError(
            f"{missing} of {spec['writes']} conversations are not written to their end, more "
            f"than synth.max_failed_fraction={synth_cfg['max_failed_fraction']}: re-run "
            "prompts_write (what was written is kept)"
        )
    runs = store.runs()
    tokens = sum(r["completion_tokens"] for r in runs)
    seconds = sum(r["elapsed_s"] for r in runs)
    written = sum(1 for e in entries if e["id"].rsplit(".", 1)[-1].startswith("w"))
    stats = {
        "conversations": spec["writes"],
        "turns_per_conversation": spec["turns"],
        "turns_written": len(lengths) + sum(removed.values()),
        "turns_kept": len(lengths),
        "removed": {r: removed[r] for r in REASONS},
        "stopped": dict(stopped),
        "not_finished": missing,
        "rows": len(out_rows),
        "chars": percentiles(lengths),
        "removed_examples": examples,
        "kept_examples": [r["messages"][-1]["content"][:300] for r in out_rows[:EXAMPLES]],
        "generation": {
            "runs": len(runs),
            "requests_journaled": len(entries),
            "write_requests_journaled": written,
            "completion_tokens": tokens,
            "elapsed_s": round(seconds, 2),
            "completion_tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        },
        "fingerprint": store.fingerprint,
        "provenance": provenance({"source": spec, "seed": seed}),
    }
    write_jsonl(rows_out, out_rows)
    write_json(stats_out, stats)
    store.discard_others()
    log.info(
        "prompts_write_gather: %d rows from %d conversations; removed %s",
        len(out_rows),
        spec["writes"],
        dict(removed),
    )
    return stats
