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
:func:`generate_on_policy`); the records carry the messages as asked, so the check and the
stages after synth read them as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.spec import seeded_sampling_args, shared_gpu_args, spec_for_target
from ..runtime import Progress, for_each
from ..runtime.files import (
    AppendLog,
    atomic_path,
    iter_jsonl,
    read_json,
    write_json,
    write_jsonl_zst,
)
from ..runtime.provenance import provenance
from ..server import Endpoint, ServerError, VllmServer, external_endpoint
from ..server import client as client_lib
from ..stats import percentiles
from ..target.chat import load_tokenizer
from ..target.stage import chat_template_text, load_info
from . import check as reasoning
from .answers import (
    AnswerStore,
    best_entries,
    current,
    entry_key,
    fingerprint,
    is_settled,
    part_of,
    prompt_key,
    settled,
)
from .conversations import Conversation, ConversationError, conversations, resolve, walk

log = logging.getLogger(__name__)

# Journal fields that stay out of the synth records
JOURNAL_ONLY = ("status", "key", "latency_s")


class SynthError(RuntimeError):
    pass


class Rejected(Exception):
    """The server refused the request (HTTP 4xx): retrying will not help."""


class Transient(Exception):
    """A timeout, connection error or 5xx: worth retrying."""


# ---- requests ---------------------------------------------------------------------------


def request_body(prompt: dict, model: str, cfg: dict) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": prompt["messages"],
        "max_tokens": cfg["max_tokens"],
        "temperature": cfg["temperature"],
        "top_p": cfg["top_p"],
        "return_token_ids": True,
    }
    if cfg.get("seed") is not None:
        # One seed per prompt: the same prompt gets the same sample on a resumed run.
        body["seed"] = (cfg["seed"] + zlib.crc32(prompt["id"].encode())) % (2**31)
    if cfg.get("chat_template_kwargs"):
        body["chat_template_kwargs"] = cfg["chat_template_kwargs"]
    return body


def parse_response(prompt: dict, data: dict, latency_s: float) -> dict[str, Any]:
    """Turn a chat completion into a synth record; raise Transient on an unusable response."""
    try:
        choice = data["choices"][0]
        prompt_ids = data["prompt_token_ids"]
        completion_ids = choice["token_ids"]
    except (KeyError, IndexError, TypeError) as e:
        raise Transient(
            f"response without token ids ({e!r}); the server must support "
            "return_token_ids (vLLM >= 0.10)"
        ) from e
    if not prompt_ids or completion_ids is None:
        raise Transient("response with empty token ids")
    msg = choice.get("message") or {}
    return {
        "id": prompt["id"],
        "source": prompt.get("source"),
        "messages": prompt["messages"],
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "content": msg.get("content") or "",
        "reasoning": msg.get("reasoning") or msg.get("reasoning_content"),
        "finish_reason": choice.get("finish_reason"),
        "latency_s": round(latency_s, 4),
    }


async def answer(client, endpoint: Endpoint, prompt: dict, cfg: dict) -> dict:
    """One prompt -> one record. Transient errors (connection, timeout, 408/409/429, 5xx) have
    been retried by the client (``synth.retries`` times, with backoff) when this raises."""
    import openai

    body = request_body(prompt, endpoint.model, cfg)
    t0 = time.monotonic()
    try:
        data = await client_lib.chat(client, body)
    except openai.APIStatusError as e:
        if 400 <= e.status_code < 500 and e.status_code not in (408, 409, 429):
            raise Rejected(f"HTTP {e.status_code}: {str(e)[:300]}") from e
        endpoint.check_alive()
        raise Transient(f"HTTP {e.status_code}: {str(e)[:300]}") from e
    except openai.APIConnectionError as e:  # timeouts included
        endpoint.check_alive()  # a dead server is fatal, not a failed prompt
        raise Transient(f"{type(e).__name__}: {e}") from e
    return parse_response(prompt, data, time.monotonic() - t0)


def journaling_asker(
    cfg: dict, journal: AppendLog, progress: Progress, max_model_len: int | None, outcome: Counter
):
    """``ask(client, endpoint, prompt) -> entry``: one request, its outcome journaled as it
    arrives under the prompt's key (a rejection also records the ``max_model_len`` it
    happened under) and counted in ``outcome``. Raises SynthError once so many requests in a
    row failed that the endpoint must be down."""
    consecutive_transient = 0

    async def ask(client, endpoint: Endpoint, prompt: dict) -> dict:
        nonlocal consecutive_transient
        key = prompt_key(prompt)
        try:
            rec = await answer(client, endpoint, prompt, cfg)
        except Rejected as e:
            entry = {
                "status": "rejected",
                "id": prompt["id"],
                "key": key,
                "max_model_len": max_model_len,
                "error": str(e),
            }
            journal.append(entry)
            outcome["rejected"] += 1
            progress.update(1)
            return entry
        except Transient as e:
            entry = {"status": "failed", "id": prompt["id"], "key": key, "error": str(e)}
            journal.append(entry)
            outcome["failed"] += 1
            consecutive_transient += 1
            progress.update(1)
            if consecutive_transient >= max(8, cfg["concurrency"]):
                raise SynthError(
                    f"{consecutive_transient} requests in a row failed "
                    f"(last: {e}); is the endpoint {endpoint.base_url} up?"
                ) from e
            return entry
        entry = {"status": "ok", "key": key, **rec}
        journal.append(entry)
        outcome["ok"] += 1
        outcome["completion_tokens"] += len(rec["completion_token_ids"])
        consecutive_transient = 0
        progress.update(1, extra=len(rec["completion_token_ids"]))
        return entry

    return ask


async def over_slots(endpoints: list[Endpoint], items, work, cfg: dict, transport: str) -> None:
    """``await work(client, endpoint, item)`` for every item, ``synth.concurrency`` at a time
    per endpoint: each item goes to the next free slot of any endpoint, so a faster server
    does more."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                client_lib.async_client(
                    e.base_url,
                    api_key=e.api_key,
                    timeout=cfg["request_timeout_s"],
                    max_retries=cfg["retries"],
                    transport=transport,
                )
            )
            for e in endpoints
        ]
        pending = iter(items)  # one shared iterator: each item goes to exactly one slot

        async def slot(i: int) -> None:
            for item in pending:
                await work(clients[i], endpoints[i], item)

        slots = [i for _ in range(cfg["concurrency"]) for i in range(len(endpoints))]
        await for_each(slots, slot, len(slots))


async def generate(
    endpoints: Endpoint | list[Endpoint],
    prompts: list[dict],
    cfg: dict,
    journal: AppendLog,
    progress: Progress,
    max_model_len: int | None = None,
    transport: str = "aiohttp",
) -> Counter:
    """Answer ``prompts`` with ``synth.concurrency`` requests in flight per endpoint, journaling
    each result as it arrives (under the prompt's key; a rejection also records the
    ``max_model_len`` it happened under). With several endpoints every request goes to the
    next free slot of any of them, so a faster server answers more. ``transport``: the
    client's (:func:`client.async_client`; the benchmark compares them)."""
    if isinstance(endpoints, Endpoint):
        endpoints = [endpoints]
    outcome: Counter = Counter()
    ask = journaling_asker(cfg, journal, progress, max_model_len, outcome)
    await over_slots(endpoints, prompts, ask, cfg, transport)
    return outcome


async def generate_on_policy(
    endpoints: Endpoint | list[Endpoint],
    convs: list[Conversation],
    cfg: dict,
    journal: AppendLog,
    progress: Progress,
    known: dict[tuple[str, str], dict],
    max_model_len: int | None = None,
    transport: str = "aiohttp",
) -> Counter:
    """Answer the turns of ``convs`` that have no entry in ``known`` (per
    :func:`.answers.entry_key`, the entries that need no new request), each conversation's in
    order and each turn asked only once the one before it is journaled, with the answers
    before it as its context (:func:`.conversations.walk`). Conversations run side by side,
    ``synth.concurrency`` per endpoint, those with the most turns to go first (the last one to
    start sets the stage's end). Every entry this run makes is added to ``known``: a turn
    that failed is not asked again in the same run, and the turns after it are skipped
    (counted as ``skipped`` turns, context-only ones included)."""
    if isinstance(endpoints, Endpoint):
        endpoints = [endpoints]
    outcome: Counter = Counter()
    ask = journaling_asker(cfg, journal, progress, max_model_len, outcome)

    def entry_of(prompt: dict) -> dict | None:
        return known.get(entry_key(prompt))

    async def converse(client, endpoint: Endpoint, conv: Conversation) -> None:
        while True:
            w = walk(conv, entry_of)
            if w.next is None:
                outcome["skipped"] += len(w.skipped)
                progress.update(len(w.skipped))
                return
            entry = await ask(client, endpoint, w.next)
            known[entry["id"], entry["key"]] = entry

    to_go = {c.id: len(c.turns) - len(walk(c, entry_of).asked) + 1 for c in convs}
    ordered = sorted(convs, key=lambda c: -to_go[c.id])  # stable: pool order among equals
    await over_slots(endpoints, ordered, converse, cfg, transport)
    return outcome


# ---- the token-exact check: eagle3_pipeline.synth.check ------------------------------------

check_record = reasoning.check_record
render_ids = reasoning.render_ids


# ---- the stage ----------------------------------------------------------------------------


def server_args(cfg: dict, vllm_cfg: dict) -> list[str]:
    """The synth server's own arguments: ``synth.server_args``, and where answers are sampled
    with a seed per prompt what seeded sampling needs (serving.seeded_sampling_args)."""
    args = list(cfg["server_args"])
    if cfg["temperature"] > 0 and cfg.get("seed") is not None:
        args += seeded_sampling_args(vllm_cfg, args)
    return args


@contextlib.contextmanager
def open_endpoints(cfg: dict, vllm_cfg: dict, target: dict, log_path) -> Iterator[list[Endpoint]]:
    """Where a part's requests go: the external endpoint (``synth.endpoint``), or the part's
    own vLLM servers, ``synth.servers_per_gpu`` of them sharing its GPU (started one after
    the other: each measures the memory the ones before it left)."""
    if cfg["endpoint"]:
        yield [external_endpoint(cfg["endpoint"], cfg.get("model_name"), cfg.get("api_key_env"))]
        return
    servers = cfg["servers_per_gpu"]
    spec = spec_for_target(
        vllm_cfg,
        target,
        extra_args=server_args(cfg, vllm_cfg),
        reasoning_parser=cfg.get("reasoning_parser"),
    )
    if vllm_cfg["device"] == "cuda":  # (on the CPU each server has its own KV cache size)
        spec.extra_args = shared_gpu_args(spec.extra_args, servers)
    with contextlib.ExitStack() as stack:
        endpoints = []
        for _ in range(servers):
            server = stack.enter_context(VllmServer(spec, log_path))
            endpoints.append(
                Endpoint(base_url=server.base_url, model=server.model_name, server=server)
            )
        yield endpoints


def read_prompts(prompts_path) -> list[dict]:
    prompts = list(iter_jsonl(prompts_path))
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise SynthError(f"{prompts_path} has duplicate prompt ids")
    return prompts


def on_policy(cfg: dict) -> bool:
    """Whether the context of a multi-turn prompt is the target's own answers
    (``synth.context``)."""
    return cfg.get("context", "dataset") == "on_policy"


def pool_conversations(prompts: list[dict]) -> list[Conversation]:
    try:
        return conversations(prompts)
    except ConversationError as e:
        raise SynthError(f"synth.context on_policy: {e}") from e


def outcomes(prompts: list[dict], entries: list[dict], cfg: dict) -> tuple[dict, dict]:
    """Per prompt id, the entry that counts for the prompt as synth asks it (on_policy: with
    the target's earlier answers as its context, for each turn whose earlier turns have
    theirs; context-only turns included), and per prompt id, why an on-policy turn was not
    asked (:data:`.conversations.SKIPPED_AFTER`)."""
    if not on_policy(cfg):
        return current(entries, prompts), {}
    best = best_entries(entries)
    asked, skipped = resolve(pool_conversations(prompts), lambda p: best.get(entry_key(p)))
    return current(entries, asked), skipped


def answer_counts(
    last: dict[str, dict], prompts: list[dict], skipped: dict[str, str] | None = None
) -> tuple[Counter, Counter]:
    """Per status, how many of ``prompts`` have that entry last (``last``: per prompt id, the
    entry that counts) - "missing": none, or the reason it was skipped (``skipped``); per
    error kind, how many of those without an answer failed with it."""
    skipped = skipped or {}
    found = [(p["id"], last.get(p["id"])) for p in prompts]
    status = Counter(e["status"] if e else skipped.get(pid, "missing") for pid, e in found)
    errors = Counter(e["error"].split(":")[0] for _, e in found if e and e["status"] != "ok")
    return status, errors


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


def check_failed_fraction(status: Counter, errors: Counter, n: int, cfg: dict, what: str):
    bad = n - status["ok"]
    if n and bad / n > cfg["max_failed_fraction"]:
        raise SynthError(
            f"{bad} of {n} {what} have no answer ({dict(status)}; errors: {dict(errors)}), "
            f"more than synth.max_failed_fraction={cfg['max_failed_fraction']}. Answers so far "
            "are kept: fix the cause and re-run to retry only the failed prompts."
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
    t0 = time.monotonic()
    outcome: Counter = Counter()
    journal = store.journal(part, parts)
    try:
        if todo:
            progress = Progress(
                work.requests,
                f"synth part {part}",
                unit="requests" if on_policy(cfg) else "samples",
                done=work.reused + work.skipped,
            )
            with open_endpoints(cfg, vllm_cfg, target, log_path) as endpoints:
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
    elapsed = time.monotonic() - t0
    if outcome:
        store.record_run(
            part,
            parts,
            {
                "answered": outcome["ok"],
                "completion_tokens": outcome["completion_tokens"],
                "elapsed_s": round(elapsed, 2),
            },
        )
    # (a conversation's rows are all in its part: the part's own prompts resolve alike)
    last, skipped = outcomes(mine, store.read(contexts), cfg)
    status, errors = answer_counts(last, mine, skipped)
    check_failed_fraction(status, errors, len(mine), cfg, f"prompts of part {part}")
    manifest = {
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
            "elapsed_s": round(elapsed, 2),
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
    parts = [read_json(p) for p in part_manifests]
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


def on_policy_stats(prompts: list[dict], last: dict[str, dict], skipped: dict[str, str]) -> dict:
    """The conversations behind the on-policy records: their turns, those asked only as
    context for later ones (not in the pool) and how many of those have an answer, and the
    turns skipped after an earlier one without a usable answer, by reason."""
    convs = pool_conversations(prompts)
    context_only = [t.id for c in convs for t in c.turns if not t.sample]
    return {
        "conversations": len(convs),
        "turns": sum(len(c.turns) for c in convs),
        "context_only_turns": len(context_only),
        "context_only_answered": sum(
            1 for t in context_only if t in last and last[t]["status"] == "ok"
        ),
        "turns_skipped": dict(Counter(skipped.values())),
    }


def check_tools(target: dict, cfg: dict):
    """The tokenizer the check renders with, and the markers of ``synth.reasoning_parser``
    (None without one) from the installed vLLM's parser."""
    tokenizer = load_tokenizer(target)
    if not cfg.get("reasoning_parser"):
        return tokenizer, None
    try:
        return tokenizer, reasoning.parser_markers(cfg["reasoning_parser"], tokenizer)
    except Exception as e:  # unknown name, or markers the tokenizer lacks
        raise SynthError(
            f"synth.reasoning_parser={cfg['reasoning_parser']!r} cannot be used with this "
            f"target's tokenizer ({type(e).__name__}: {e}); choose the parser of the model's "
            "family (vLLM's --reasoning-parser names)"
        ) from e


def finalize(
    prompts,
    entries: list[dict],
    records_out,
    stats_out,
    cfg,
    target,
    prompts_path,
    this_run: dict,
    history: list[dict],
    work_dir=None,
    *,
    load,
) -> dict:
    """The merged records (in the pool's order) and the stage's stats from the journals'
    ``entries`` (read without what only a record needs); ``load`` gives the whole entries of
    those that are answers, in their order (:meth:`.answers.AnswerStore.full`)."""

    gen_tokens = sum(h["completion_tokens"] for h in history)
    gen_s = sum(h["elapsed_s"] for h in history)
    last, skipped = outcomes(prompts, entries, cfg)
    n = len(prompts)
    status, errors = answer_counts(last, prompts, skipped)
    check_failed_fraction(status, errors, n, cfg, "prompts")

    tokenizer, markers = check_tools(target, cfg)
    kwargs = cfg.get("chat_template_kwargs") or {}
    template = chat_template_text(target)
    finish, mismatches, kinds, causes, examples = Counter(), Counter(), Counter(), Counter(), []
    prompt_tokens = completion_tokens = with_reasoning = 0
    latencies = []

    def records():
        nonlocal prompt_tokens, completion_tokens, with_reasoning
        answers = (e for p in prompts if (e := last.get(p["id"])) and e["status"] == "ok")
        for e in load(answers):
            # the record is what the target answered; how long it took (which changes from
            # run to run) stays in the journal and the stats, so equal answers give equal bytes
            rec = {k: v for k, v in e.items() if k not in JOURNAL_ONLY}
            finish[rec["finish_reason"]] += 1
            prompt_tokens += len(rec["prompt_token_ids"])
            completion_tokens += len(rec["completion_token_ids"])
            with_reasoning += bool(rec.get("reasoning"))
            latencies.append(e["latency_s"])
            problem = check_record(tokenizer, rec, kwargs, markers, template)
            if problem:
                mismatches[problem["part"]] += 1
                kinds[problem["kind"]] += 1
                if problem["kind"] == "text":
                    causes[problem.get("cause", problem["part"])] += 1
                # Text mismatches first: they are the ones that matter.
                if problem["kind"] == "text" and len(examples) >= 5:
                    examples[:] = [e for e in examples if e["kind"] == "text"][:4]
                if len(examples) < 5:
                    examples.append(problem)
            yield rec

    with atomic_path(records_out) as staged:
        written = write_jsonl_zst(staged, records())
        ok = status["ok"]
        mismatch_total = sum(mismatches.values())
        text_mismatches = kinds["text"]
        stats = {
            "prompts": n,
            "samples_ok": ok,
            "samples_failed": dict((k, v) for k, v in status.items() if k != "ok"),
            "errors": dict(errors),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "finish_reasons": dict(finish),
            "reasoning_capture_rate": (with_reasoning / ok) if ok else 0.0,
            "reasoning_parser": cfg.get("reasoning_parser"),
            "generation": {  # every run that generated, resumed ones included
                "runs": len(history),
                "completion_tokens": gen_tokens,
                "elapsed_s": round(gen_s, 2),
                "completion_tokens_per_s": round(gen_tokens / max(gen_s, 1e-9), 1)
                if history
                else None,
            },
            # the parts' last runs (each part's manifest has its own)
            "this_run": {
                **{k: v for k, v in this_run.items() if k != "completion_tokens"},
                "completion_tokens_per_s": round(
                    this_run["completion_tokens"] / max(this_run["elapsed_s"], 1e-9), 1
                ),
            },
            "latency_s": percentiles(latencies),
            "template_check": {
                "checked": written,
                "mismatches": mismatch_total,
                "text_mismatches": text_mismatches,
                "tokenization_only": kinds["tokenization"],
                "by_part": dict(mismatches),
                "text_by_cause": dict(causes),
                "markers": [markers.start, markers.end] if markers else None,
                "chat_template": target.get("chat_template_file"),
                "examples": examples,
            },
            "provenance": provenance(
                {k: cfg[k] for k in sorted(cfg)}, inputs={"prompts": prompts_path}
            ),
        }
        if on_policy(cfg):
            stats["on_policy"] = on_policy_stats(prompts, last, skipped)
        if written and text_mismatches / written > cfg["max_template_mismatch_fraction"]:
            raise SynthError(
                reasoning.failure_message(
                    text_mismatches,
                    written,
                    dict(causes),
                    examples,
                    cfg,
                    work_dir or "the work dir",
                )
            )
    write_json(stats_out, stats)
    log.info(
        "synth: %d samples, %d completion tokens, template check: %d text mismatches, "
        "%d re-tokenization differences; finish %s",
        ok,
        completion_tokens,
        text_mismatches,
        kinds["tokenization"],
        dict(finish),
    )
    return stats
