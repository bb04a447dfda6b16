"""Small synth.jsonl.zst files for the prepare and vocab tests (imported by those tests)."""

from __future__ import annotations

from pathlib import Path

import zstandard

from eagle3_pipeline.runtime import files as fileio


def record(rid: str, prompt: list, completion: list, **extra) -> dict:
    """A synth record as the synth stage writes it (messages and text are only decoration)."""
    return {
        "id": rid,
        "source": "test",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "content": "text",
        "reasoning": None,
        "finish_reason": "stop",
        "latency_s": 0.1,
        **extra,
    }


def write_records(path: Path, rows: list[dict]) -> Path:
    fileio.write_jsonl_zst(path, rows)
    return path


def write_lines(path: Path, lines: list[bytes]) -> Path:
    """Raw lines (for JSON that json.dumps would never write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n"))
    return path
