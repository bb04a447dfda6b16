"""The requests of a ``self_written`` source: a written user turn is a completion of the
template's prefix given as token ids (:func:`write`), an answer between two turns is a chat
request as synth asks it (:func:`..synth.client.answer`); conversations go side by side,
``synth.concurrency`` per endpoint, each step journaled as it arrives (:func:`generate`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..runtime import Progress
from ..runtime.files import AppendLog
from ..server import Endpoint
from ..server import client as client_lib
from ..synth.answers import entry_key
from ..synth.client import Transient, answer, journaling_asker, over_slots, post, prompt_seed
from .conversations import Conversation, walk
from .template import user_turn


def write_body(step: dict, model: str, turn, cfg: dict) -> dict[str, Any]:
    """A completion of the template's prefix for a new user turn (``turn``: its
    :class:`.template.UserTurn`), sampled with the source's settings."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": turn.prefix_ids,
        "max_tokens": cfg["max_tokens"],
        "temperature": cfg["temperature"],
        "top_p": cfg["top_p"],
        "seed": prompt_seed(cfg["seed"], step["id"]),
        "return_token_ids": True,
        "skip_special_tokens": False,  # markup the writer emits stays visible to the filters
    }
    if turn.stop_token_ids:
        body["stop_token_ids"] = turn.stop_token_ids
    if turn.stop:
        body["stop"] = turn.stop
    return body


def parse_write(step: dict, data: dict, latency_s: float, turn) -> dict[str, Any]:
    """A completion -> a journal record of the written turn (its text without the token that
    ended it)."""
    try:
        choice = data["choices"][0]
        completion_ids = choice["token_ids"]
        prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
    except (KeyError, IndexError, TypeError) as e:
        raise Transient(f"response without token ids ({e!r}); vLLM >= 0.10 returns them") from e
    if completion_ids is None:
        raise Transient("response with empty token ids")
    return {
        "id": step["id"],
        "messages": step["messages"],
        "prompt_token_ids": prompt_ids or turn.prefix_ids,
        "completion_token_ids": completion_ids,
        "content": choice.get("text") or "",
        "finish_reason": choice.get("finish_reason"),
        "latency_s": round(latency_s, 4),
    }


def writer(tokenizer, kwargs: dict, chat_template):
    """``request(client, endpoint, step, cfg) -> record`` for a write step: the prefix is
    rendered here, from the step's messages, with the target's template."""

    async def write(client, endpoint: Endpoint, step: dict, cfg: dict) -> dict:
        turn = user_turn(tokenizer, step["messages"], kwargs, chat_template)
        body = write_body(step, endpoint.model, turn, cfg)
        data, seconds = await post(endpoint, client_lib.completion(client, body))
        return parse_write(step, data, seconds, turn)

    return write


async def generate(
    endpoints: list[Endpoint],
    convs: list[Conversation],
    write_cfg: dict,
    answer_cfg: dict,
    request_write,
    journal: AppendLog,
    progress: Progress,
    known: dict[tuple[str, str], dict],
    max_model_len: int | None,
    markers: tuple = (),
) -> Counter:
    """Ask the steps of ``convs`` that have no entry in ``known``, each conversation's in order
    (:func:`.conversations.walk`), conversations side by side; every entry made is added to
    ``known``."""
    outcome: Counter = Counter()
    ask_write = journaling_asker(
        write_cfg, journal, progress, max_model_len, outcome, request=request_write
    )
    ask_answer = journaling_asker(answer_cfg, journal, progress, max_model_len, outcome, answer)

    def entry_of(step: dict) -> dict | None:
        return known.get(entry_key(step))

    async def converse(client, endpoint: Endpoint, conv: Conversation) -> None:
        while True:
            w = walk(conv, entry_of, markers)
            if w.next is None:
                return
            ask = ask_write if w.next["step"] == "write" else ask_answer
            entry = await ask(client, endpoint, w.next)
            known[entry["id"], entry["key"]] = entry

    await over_slots(endpoints, convs, converse, write_cfg, "aiohttp")
    return outcome
