"""Synth stage: the target's own answers, stored with the exact token ids it saw and produced.

Each prompt becomes one chat request with ``return_token_ids``; the record keeps
``prompt_token_ids`` and ``completion_token_ids`` from the server, so training sequences are
what the model saw by construction (thinking wrappers included). A check
(:mod:`eagle3_pipeline.synth.check`) reports records whose ids disagree with their messages and
text; the gather fails above ``synth.max_template_mismatch_fraction`` with the answers kept.

The stage is ``synth.jobs`` independent parts and a gather: each part (:func:`run_part`)
answers the prompts :func:`.answers.part_of` gives it, on its own vLLM server(s), journaling
every answer as it arrives (:mod:`.answers`); the gather (:func:`gather`) merges every answer
into one output in the prompt pool's order, whatever the number of parts, and checks it.
A part answers only the prompts without an answer under their current key, so a killed job
loses at most its in-flight requests, a failed part costs only its own prompts, and changing
the number of parts or adding prompts asks only for what has no answer yet.

With ``synth.context: on_policy`` a part answers whole conversations instead of prompts, each
turn with the target's own earlier answers as its context (:mod:`.conversations`,
:func:`.client.generate_on_policy`); the records carry the messages as asked, so the check and
the stages after synth read them as any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..runtime import Progress, StageClock
from ..runtime.files import write_json
from ..runtime.provenance import provenance
from ..runtime.results import SYNTH_PART, format_tag, read_result
from ..server import ServerError
from ..target.stage import load_info
from .answers import (
    AnswerStore,
    best_entries,
    entry_key,
    fingerprint,
    is_settled,
    part_of,
    settled,
)
from .client import generate, generate_on_policy, open_endpoints
from .conversations import walk
from .errors import SynthError
from .records import (
    answer_counts,
    check_failed_fraction,
    check_tools,
    finalize,
    on_policy,
    outcomes,
    pool_conversations,
    read_prompts,
)

log = logging.getLogger(__name__)


@dataclass
class PartWork:
    """What a part has to do: its prompts of the pool and the requests they take."""

    mine: list[dict]  # the pool's prompts the part answers
    todo: list  # prompts without an answer, or (on_policy) conversations with a turn to ask
    requests: int  # requests the part's prompts take (on_policy: every turn, context included)
    reused: int  # of them, those answered (or rejected at this max_model_len) before
    skipped: int  # on_policy: turns not asked, after an earlier turn without a usable answer
    known: dict  # on_policy: the entries that need no new request, by answers.entry_key


def part_work(prompts, entries, part: int, parts: int, cfg: dict, max_model_len) -> PartWork:
    """The prompts of part ``part`` of ``parts`` (on_policy: the turns of its conversations,
    a conversation's part chosen by its id) and which of them need a request."""
    if not on_policy(cfg):
        mine = [p for p in prompts if part_of(p["id"], parts) == part]
        done = settled(entries, mine, max_model_len)
        todo = [p for p in mine if p["id"] not in done]
        return PartWork(mine, todo, len(mine), len(done), 0, {})
    convs = [c for c in pool_conversations(prompts) if part_of(c.id, parts) == part]
    samples = {t.id for c in convs for t in c.turns if t.sample}
    known = {k: e for k, e in best_entries(entries).items() if is_settled(e, max_model_len)}
    walks = [walk(c, lambda p: known.get(entry_key(p))) for c in convs]
    return PartWork(
        mine=[p for p in prompts if p["id"] in samples],
        todo=[c for c, w in zip(convs, walks, strict=True) if w.next is not None],
        requests=sum(len(c.turns) for c in convs),
        reused=sum(len(w.asked) - (w.next is not None) for w in walks),
        skipped=sum(len(w.skipped) for w in walks),
        known=known,
    )


def run_part(
    target_json,
    prompts_path,
    part_out,
    part: int,
    parts: int,
    cfg: dict,
    vllm_cfg: dict,
    work_dir,
    log_path=None,
) -> dict:
    """Rule ``synth`` (one job per part): answer the prompts of part ``part`` of ``parts``
    that have no answer yet, then write the part's manifest (last, atomically)."""
    target = load_info(target_json)
    prompts = read_prompts(prompts_path)
    check_tools(target, cfg)  # a parser the check cannot use fails now, not after the answers
    store = AnswerStore(work_dir, fingerprint(target, cfg, vllm_cfg))
    max_model_len = vllm_cfg["max_model_len"]
    contexts = on_policy(cfg)  # an on-policy turn's context holds the answers before it
    work = part_work(prompts, store.read(contexts), part, parts, cfg, max_model_len)
    mine, todo = work.mine, work.todo
    if not mine:
        log.warning(
            "synth part %d of %d has no prompts (%d prompts over %d parts): nothing to answer; "
            "fewer synth.jobs would start fewer servers",
            part,
            parts,
            len(prompts),
            parts,
        )
    log.info(
        "synth part %d of %d: %d of %d prompts, %d requests (%s), %d already answered, %d to go",
        part,
        parts,
        len(mine),
        len(prompts),
        work.requests,
        "turns of conversations, context on-policy" if on_policy(cfg) else "one each",
        work.reused,
        work.requests - work.reused - work.skipped,
    )
    clock = StageClock()
    outcome: Counter = Counter()
    journal = store.journal(part, parts)
    try:
        if todo:
            with open_endpoints(cfg, vllm_cfg, target, log_path) as endpoints:
                clock.ready()
                progress = Progress(
                    work.requests,
                    f"synth part {part}",
                    unit="requests" if on_policy(cfg) else "samples",
                    done=work.reused + work.skipped,
                )
                if on_policy(cfg):
                    asking = generate_on_policy(
                        endpoints, todo, cfg, journal, progress, work.known, max_model_len
                    )
                else:
                    asking = generate(endpoints, todo, cfg, journal, progress, max_model_len)
                outcome = asyncio.run(asking)
    except ServerError as e:
        kept = part_work(prompts, store.read(contexts), part, parts, cfg, max_model_len).reused
        raise SynthError(
            f"the vLLM server died mid-run; {kept} of {work.requests} answers of part {part} "
            f"are kept in {store.dir} and a re-run resumes from them.\n{e}"
        ) from e
    finally:
        journal.close()
    times = clock.split()
    if outcome:
        store.record_run(
            part,
            parts,
            {"answered": outcome["ok"], "completion_tokens": outcome["completion_tokens"], **times},
        )
    # (a conversation's rows are all in its part: the part's own prompts resolve alike)
    last, skipped = outcomes(mine, store.read(contexts), cfg)
    status, errors = answer_counts(last, mine, skipped)
    check_failed_fraction(status, errors, len(mine), cfg, f"prompts of part {part}")
    manifest = {
        "format": format_tag(SYNTH_PART),
        "part": part,
        "parts": parts,
        "prompts": len(mine),
        "status": dict(status),
        "context": cfg.get("context", "dataset"),
        "requests": work.requests,
        "fingerprint": store.fingerprint,
        "this_run": {
            "server_started": bool(todo) and not cfg["endpoint"],
            "servers": cfg["servers_per_gpu"] if todo and not cfg["endpoint"] else 0,
            "reused": work.reused,
            "answered": outcome["ok"],
            "rejected": outcome["rejected"],
            "failed": outcome["failed"],
            "completion_tokens": outcome["completion_tokens"],
            **times,
        },
        "provenance": provenance(
            {k: cfg[k] for k in sorted(cfg)}, inputs={"prompts": prompts_path}
        ),
    }
    write_json(part_out, manifest)
    return manifest


def gather(
    target_json,
    prompts_path,
    part_manifests,
    records_out,
    stats_out,
    cfg: dict,
    vllm_cfg: dict,
    work_dir,
) -> dict:
    """Rule ``synth_gather``: every part's answers merged into one output in the prompt pool's
    order (the same whatever the number of parts), checked, with the stage's stats."""
    target = load_info(target_json)
    prompts = read_prompts(prompts_path)
    store = AnswerStore(work_dir, fingerprint(target, cfg, vllm_cfg))
    parts = [read_result(p, SYNTH_PART) for p in part_manifests]
    stale = [p["part"] for p in parts if p.get("fingerprint") != store.fingerprint]
    if stale or {p["parts"] for p in parts} != {len(parts)}:
        raise SynthError(
            f"the synth parts {stale or [p['part'] for p in parts]} were answered for other "
            f"settings or another number of parts than the {len(parts)} given: re-run them "
            "(snakemake -R synth)"
        )
    runs = [p["this_run"] for p in parts]
    this_run = {
        "server_started": any(r["server_started"] for r in runs),
        "servers": sum(r.get("servers", int(r["server_started"])) for r in runs),
        "parts": len(parts),
        **{k: sum(r[k] for r in runs) for k in ("reused", "answered", "rejected", "failed")},
        # parts run side by side: the stage's time is its slowest part's
        "elapsed_s": max((r["elapsed_s"] for r in runs), default=0.0),
        "server_start_s": max((r.get("server_start_s", 0.0) for r in runs), default=0.0),
        "completion_tokens": sum(r["completion_tokens"] for r in runs),
    }
    stats = finalize(
        prompts,
        store.read(on_policy(cfg)),
        records_out,
        stats_out,
        cfg,
        target,
        prompts_path,
        this_run,
        store.runs(),
        work_dir=store.dir,
        load=store.full,
    )
    store.discard_others()
    return stats


def run(
    target_json,
    prompts_path,
    records_out,
    stats_out,
    cfg: dict,
    vllm_cfg: dict,
    work_dir,
    log_path=None,
) -> dict:
    """The whole stage in one process: every part in turn (``synth.jobs`` of them), then the
    gather (the workflow runs the parts as jobs of their own)."""
    parts = cfg.get("jobs", 1)
    manifests = []
    for part in range(parts):
        path = Path(work_dir) / "parts" / f"part_{part}.json"
        run_part(target_json, prompts_path, path, part, parts, cfg, vllm_cfg, work_dir, log_path)
        manifests.append(path)
    return gather(
        target_json, prompts_path, manifests, records_out, stats_out, cfg, vllm_cfg, work_dir
    )
