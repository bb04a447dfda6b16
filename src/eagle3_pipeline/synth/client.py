"""How a synth part asks: its endpoints (:func:`open_endpoints`: the external one, or its own
vLLM servers) and its requests, one prompt to one record (:func:`answer`), ``synth.concurrency``
at a time per endpoint (:func:`generate`, and :func:`generate_on_policy` for whole
conversations), each outcome journaled as it arrives (:func:`journaling_asker`)."""

from __future__ import annotations

import contextlib
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..engine.spec import seeded_sampling_args, shared_gpu_args, spec_for_target
from ..runtime import Progress, for_each
from ..runtime.files import AppendLog
from ..server import Endpoint, VllmServer, external_endpoint
from ..server import client as client_lib
from .answers import entry_key, prompt_key
from .conversations import Conversation, walk
from .errors import SynthError


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
