"""Which answer counts for each prompt (:func:`outcomes`: on-policy, the turns whose context
has its earlier answers), how many have none (:func:`answer_counts`,
:func:`check_failed_fraction`), and the merged records with the stage's stats and the
token-exact check (:func:`finalize`)."""

from __future__ import annotations

import logging
from collections import Counter

from ..runtime.files import atomic_path, iter_jsonl, write_json, write_jsonl_zst
from ..runtime.provenance import provenance
from ..stats import percentiles
from ..target.chat import load_tokenizer
from ..target.stage import chat_template_text
from . import check as reasoning
from .answers import best_entries, current, entry_key
from .conversations import Conversation, ConversationError, conversations, resolve
from .errors import SynthError

log = logging.getLogger(__name__)

# Journal fields that stay out of the synth records
JOURNAL_ONLY = ("status", "key", "latency_s")


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


def check_failed_fraction(status: Counter, errors: Counter, n: int, cfg: dict, what: str):
    bad = n - status["ok"]
    if n and bad / n > cfg["max_failed_fraction"]:
        raise SynthError(
            f"{bad} of {n} {what} have no answer ({dict(status)}; errors: {dict(errors)}), "
            f"more than synth.max_failed_fraction={cfg['max_failed_fraction']}. Answers so far "
            "are kept: fix the cause and re-run to retry only the failed prompts."
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
            problem = reasoning.check_record(tokenizer, rec, kwargs, markers, template)
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
