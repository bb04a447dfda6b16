"""What a failed run says it kept (plan/kept.py): only unfinished parts, counted as the
stages store them."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_pipeline.plan import kept
from eagle3_pipeline.runtime.files import AppendLog
from eagle3_pipeline.synth.answers import AnswerStore

FP = "0123456789abcdef" * 4  # the fingerprint of the answers synth would reuse


def journal(
    run: Path, part: int, parts: int, answers: int, torn: bool = False, fp: str = FP
) -> None:
    store = AnswerStore(run / "synth" / ".partial", fp)
    log = store.journal(part, parts)
    for i in range(answers):
        log.append({"id": f"p{part}-{i}", "status": "ok"})
    log.close()
    if torn:  # a job killed mid-write leaves half a line
        with log.path.open("a") as f:
            f.write('{"id": "half')


def test_a_run_that_kept_nothing_says_nothing(tmp_path):
    assert kept.message(tmp_path, {}) is None  # (no target yet: no synth settings read)


def test_unfinished_synth_parts_are_counted_and_finished_ones_left_out(tmp_path):
    journal(tmp_path, 0, 2, 5, torn=True)
    journal(tmp_path, 1, 2, 7)
    (tmp_path / "synth" / "parts").mkdir(parents=True)
    (tmp_path / "synth" / "parts" / "part_1.json").write_text("{}")
    assert kept.kept_work(tmp_path, FP) == ["synth part 0 of 2: 5 answers journaled"]


def test_journals_of_other_settings_are_not_counted(tmp_path):
    """Answers under another fingerprint (other generation settings) are not reused: not kept."""
    journal(tmp_path, 0, 1, 4, fp="f" * 64)
    assert kept.kept_work(tmp_path, FP) == []
    journal(tmp_path, 0, 1, 2)
    assert kept.kept_work(tmp_path, FP) == ["synth part 0 of 1: 2 answers journaled"]


def test_hidden_states_count_until_the_manifest_is_written(tmp_path):
    shard = tmp_path / "hidden_states" / "shards" / "shard_00000"
    shard.mkdir(parents=True)
    for i in range(3):
        (shard / f"hs_{i}.safetensors").write_bytes(b"x")
    (shard / "hs_3.safetensors.tmp").write_bytes(b"x")  # a file still being written
    assert kept.kept_work(tmp_path, None) == ["extract: hidden states of 3 samples written"]
    (tmp_path / "hidden_states" / "manifest.json").write_text(json.dumps({}))
    assert kept.kept_work(tmp_path, None) == []


def test_training_checkpoints_count_until_the_drafter_is_exported(tmp_path):
    for epoch in ("0", "1"):
        (tmp_path / "train_work" / "eagle3" / "checkpoints" / epoch).mkdir(parents=True)
    (tmp_path / "train_work" / "dflash" / "checkpoints" / "0").mkdir(parents=True)
    (tmp_path / "drafter" / "dflash").mkdir(parents=True)
    (tmp_path / "drafter" / "dflash" / "metrics.json").write_text("{}")
    text = kept.message(tmp_path, {})
    assert "train eagle3: checkpoints 0, 1" in text
    assert "dflash" not in text
    assert "the same command resumes" in text and "set-resources" in text


def test_journal_lines_are_counted_without_reading_entries(tmp_path):
    path = tmp_path / "j.jsonl"
    log = AppendLog(path)
    log.open()
    for i in range(2500):
        log.append({"id": i, "text": "x" * 1000})
    log.close()
    assert kept._lines(path) == 2500
