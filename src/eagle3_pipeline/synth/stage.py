"""Synth stage: the target's own answers, stored with the exact token ids it saw and produced.

Each prompt becomes one chat request with ``return_token_ids``; the record keeps
``prompt_token_ids`` and ``completion_token_ids`` from the server, so training sequences are
what the model saw by construction (thinking wrappers included). A check
(:mod:`eagle3_pipeline.synth.check`) reports records whose ids disagree with their messages and
text; the job fails above ``synth.max_template_mismatch_fraction`` with the journal kept.

Resume and reuse: every finished request is appended to a journal (``<work_dir>/journal.jsonl``)
as it completes, under a key of its prompt (id and messages). A run answers only the prompts
without an answer under their current key: a killed job loses at most its in-flight requests,
and an edited prompt pool costs only its new or changed prompts. The journal is tied to a
fingerprint of the target and the generation parameters and is discarded when they change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config import RESULT_KEYS
from ..engine.spec import seeded_sampling_args, spec_for_target
from ..runtime import Progress, for_each
from ..runtime.files import (
    AppendLog,
    atomic_path,
    iter_jsonl,
    read_json,
    stable_hash,
    write_json,
    write_jsonl_zst,
)
from ..runtime.provenance import provenance
from ..server import Endpoint, ServerError, VllmServer, external_endpoint
from ..server import client as client_lib
from ..stats import percentiles
from ..target.stage import chat_template_text, load_info
from . import check as reasoning

log = logging.getLogger(__name__)

# What every answer depends on: the result-determining keys of synth, except max_model_len,
# which only decides which prompts are rejected (recorded per rejection, see settled()).
JOURNAL_KEYS = tuple(k for k in RESULT_KEYS["synth_gather"] if k != "vllm.max_model_len")
# Bump when a change alters what a journaled answer holds for the same prompt and settings (how
# a request is built or a response is read): every answer is then asked for again.
ANSWER_FORMAT = 1


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


async def generate(
    endpoint: Endpoint,
    prompts: list[dict],
    cfg: dict,
    journal: AppendLog,
    progress: Progress,
    max_model_len: int | None = None,
    transport: str = "aiohttp",
) -> Counter:
    """Answer ``prompts`` with bounded concurrency, journaling each result as it arrives (under
    the prompt's key; a rejection also records the ``max_model_len`` it happened under).
    ``transport``: the client's (:func:`client.async_client`; the benchmark compares them)."""
    outcome: Counter = Counter()
    consecutive_transient = 0

    async def one(client, prompt: dict) -> None:
        nonlocal consecutive_transient
        key = prompt_key(prompt)
        try:
            rec = await answer(client, endpoint, prompt, cfg)
            journal.append({"status": "ok", "key": key, **rec})
            outcome["ok"] += 1
            outcome["completion_tokens"] += len(rec["completion_token_ids"])
            consecutive_transient = 0
            progress.update(1, extra=len(rec["completion_token_ids"]))
        except Rejected as e:
            journal.append(
                {
                    "status": "rejected",
                    "id": prompt["id"],
                    "key": key,
                    "max_model_len": max_model_len,
                    "error": str(e),
                }
            )
            outcome["rejected"] += 1
            progress.update(1)
        except Transient as e:
            journal.append({"status": "failed", "id": prompt["id"], "key": key, "error": str(e)})
            outcome["failed"] += 1
            consecutive_transient += 1
            progress.update(1)
            if consecutive_transient >= max(8, cfg["concurrency"]):
                raise SynthError(
                    f"{consecutive_transient} requests in a row failed "
                    f"(last: {e}); is the endpoint {endpoint.base_url} up?"
                ) from e

    client = client_lib.async_client(
        endpoint.base_url,
        api_key=endpoint.api_key,
        timeout=cfg["request_timeout_s"],
        max_retries=cfg["retries"],
        transport=transport,
    )
    async with client:
        await for_each(prompts, lambda p: one(client, p), cfg["concurrency"])
    return outcome


# ---- the journal and resume -------------------------------------------------------------


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


def open_journal(work_dir: Path, fp: str) -> tuple[AppendLog, list[dict]]:
    """The journal of earlier attempts, or a fresh one when the target or the generation
    parameters changed."""
    fp_file = work_dir / "fingerprint.json"
    if work_dir.exists():
        old = read_json(fp_file).get("fingerprint") if fp_file.exists() else None
        if old != fp:
            log.info(
                "target or generation parameters changed: discarding partial work in %s", work_dir
            )
            shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(fp_file, {"fingerprint": fp})
    journal = AppendLog(work_dir / "journal.jsonl")
    return journal, journal.open()


def current(entries: list[dict], prompts: list[dict]) -> dict[str, dict]:
    """Per prompt id, the last journal entry made for the prompt as it is now (an entry for an
    earlier version of an edited prompt does not count); a later ok replaces a failure."""
    keys = {p["id"]: prompt_key(p) for p in prompts}
    out: dict[str, dict] = {}
    for e in entries:
        if e.get("key") is not None and keys.get(e["id"]) == e["key"]:
            out[e["id"]] = e
    return out


def settled(entries: list[dict], prompts: list[dict], max_model_len: int) -> dict[str, dict]:
    """Entries that need no new request: answers, and rejections made under the same
    ``max_model_len`` (a longer context may accept the prompt)."""
    return {
        pid: e
        for pid, e in current(entries, prompts).items()
        if e["status"] == "ok"
        or (e["status"] == "rejected" and e.get("max_model_len") == max_model_len)
    }


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
def open_endpoint(cfg: dict, vllm_cfg: dict, target: dict, log_path) -> Iterator[Endpoint]:
    if cfg["endpoint"]:
        yield external_endpoint(cfg["endpoint"], cfg.get("model_name"), cfg.get("api_key_env"))
        return
    spec = spec_for_target(
        vllm_cfg,
        target,
        extra_args=server_args(cfg, vllm_cfg),
        reasoning_parser=cfg.get("reasoning_parser"),
    )
    with VllmServer(spec, log_path) as server:
        yield Endpoint(base_url=server.base_url, model=server.model_name, server=server)


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
    target = load_info(target_json)
    work_dir = Path(work_dir)
    prompts = list(iter_jsonl(prompts_path))
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise SynthError(f"{prompts_path} has duplicate prompt ids")

    check_tools(target, cfg)  # a parser the check cannot use fails now, not after the answers
    journal, entries = open_journal(work_dir, fingerprint(target, cfg, vllm_cfg))
    max_model_len = vllm_cfg["max_model_len"]
    done = settled(entries, prompts, max_model_len)
    todo = [p for p in prompts if p["id"] not in done]
    log.info("synth: %d prompts, %d already answered, %d to go", len(prompts), len(done), len(todo))
    t0 = time.monotonic()
    outcome: Counter = Counter()
    try:
        if todo:
            progress = Progress(len(prompts), "synth", unit="samples", done=len(done))
            with open_endpoint(cfg, vllm_cfg, target, log_path) as endpoint:
                outcome = asyncio.run(
                    generate(endpoint, todo, cfg, journal, progress, max_model_len)
                )
    except ServerError as e:
        kept = len(settled(journal.read(), prompts, max_model_len))
        raise SynthError(
            f"the vLLM server died mid-run; {kept} of "
            f"{len(prompts)} answers are kept in {work_dir} and a re-run resumes "
            f"from them.\n{e}"
        ) from e
    finally:
        journal.close()
    elapsed = time.monotonic() - t0
    runs = AppendLog(work_dir / "runs.jsonl")
    runs.open()
    if outcome:
        runs.append(
            {
                "answered": outcome["ok"],
                "completion_tokens": outcome["completion_tokens"],
                "elapsed_s": round(elapsed, 2),
            }
        )
    history = runs.read()
    runs.close()
    return finalize(
        prompts,
        journal,
        records_out,
        stats_out,
        cfg,
        target,
        prompts_path,
        elapsed,
        outcome,
        history,
        reused=len(done),
        server_started=bool(todo) and not cfg["endpoint"],
        work_dir=work_dir,
    )


def check_tools(target: dict, cfg: dict):
    """The tokenizer the check renders with, and the markers of ``synth.reasoning_parser``
    (None without one) from the installed vLLM's parser."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        target["model_path"], trust_remote_code=target.get("trust_remote_code")
    )
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
    journal: AppendLog,
    records_out,
    stats_out,
    cfg,
    target,
    prompts_path,
    elapsed: float,
    outcome: Counter,
    history: list[dict],
    reused: int = 0,
    server_started: bool = False,
    work_dir=None,
) -> dict:

    gen_tokens = sum(h["completion_tokens"] for h in history)
    gen_s = sum(h["elapsed_s"] for h in history)
    last = current(journal.read(), prompts)
    n = len(prompts)
    status = Counter(last[p["id"]]["status"] if p["id"] in last else "missing" for p in prompts)
    bad = n - status["ok"]
    errors = Counter(e["error"].split(":")[0] for e in last.values() if e["status"] != "ok")
    if n and bad / n > cfg["max_failed_fraction"]:
        raise SynthError(
            f"{bad} of {n} prompts have no answer ({dict(status)}; errors: {dict(errors)}), "
            f"more than synth.max_failed_fraction={cfg['max_failed_fraction']}. Answers so far "
            "are kept: fix the cause and re-run to retry only the failed prompts."
        )

    tokenizer, markers = check_tools(target, cfg)
    kwargs = cfg.get("chat_template_kwargs") or {}
    template = chat_template_text(target)
    finish, mismatches, kinds, causes, examples = Counter(), Counter(), Counter(), Counter(), []
    prompt_tokens = completion_tokens = with_reasoning = 0
    latencies = []

    def records():
        nonlocal prompt_tokens, completion_tokens, with_reasoning
        for p in prompts:
            e = last.get(p["id"])
            if not e or e["status"] != "ok":
                continue
            rec = {k: v for k, v in e.items() if k not in ("status", "key")}
            finish[rec["finish_reason"]] += 1
            prompt_tokens += len(rec["prompt_token_ids"])
            completion_tokens += len(rec["completion_token_ids"])
            with_reasoning += bool(rec.get("reasoning"))
            latencies.append(rec["latency_s"])
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
            "this_run": {
                "server_started": server_started,
                "reused": reused,
                "answered": outcome["ok"],
                "rejected": outcome["rejected"],
                "failed": outcome["failed"],
                "elapsed_s": round(elapsed, 2),
                "completion_tokens_per_s": round(
                    outcome["completion_tokens"] / max(elapsed, 1e-9), 1
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
