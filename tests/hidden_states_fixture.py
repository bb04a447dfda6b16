"""Real training inputs for tests: hidden states, prepared dataset and vocab map of a target.

Reusable by every stage's tests. Given an HF target directory and a few token-id rows (or
:func:`chat_rows` to make them from real text with the chat template), :func:`build` writes

    <out>/dataset/                      prepare format (datasets.save_to_disk, torch format):
                                        input_ids, loss_mask (int64 lists), seq_len, sample_id
    <out>/hidden_states/manifest.json   the documented manifest (docs/architecture.md)
    <out>/hidden_states/shards/shard_<s>/hs_<i>.safetensors  + shard.json seals
    <out>/vocab/d2t.npy, t2d.npy        speculators' build_vocab_mappings_from_distribution
    <out>/vocab/token_freq.pt           counts where loss_mask == 1

Hidden states are computed with transformers exactly as vLLM's extract_hidden_states does:
aux layer i is HF ``hidden_states[i]``; the final layer N is the output of the last decoder
layer *before* the final norm (a forward hook; HF's ``hidden_states[N]`` is after the norm).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from eagle3_pipeline.hidden_states.shards import samples_digest

# Short real question/answer pairs: the rows are rendered with the target's chat template and
# the loss mask covers the assistant answer (as prepare does).
QA = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name three primary colors.", "The three primary colors are red, blue and yellow."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What does a thermometer measure?", "A thermometer measures temperature."),
    ("Translate 'hello' into Spanish.", "'Hello' in Spanish is 'hola'."),
    ("What is 12 times 12?", "12 times 12 is 144."),
    ("Which planet is known as the red planet?", "Mars is known as the red planet."),
    ("Give me a synonym for 'happy'.", "A synonym for 'happy' is 'joyful'."),
    (
        "What is the boiling point of water at sea level?",
        "Water boils at 100 degrees Celsius at sea level.",
    ),
    ("Who wrote 'Romeo and Juliet'?", "William Shakespeare wrote 'Romeo and Juliet'."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("Write a Python function that adds two numbers.", "def add(a, b):\n    return a + b"),
    (
        "What gas do plants absorb from the air?",
        "Plants absorb carbon dioxide from the air for photosynthesis.",
    ),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is the opposite of 'cold'?", "The opposite of 'cold' is 'hot'."),
    (
        "Explain what a noun is in one sentence.",
        "A noun is a word that names a person, place, thing or idea.",
    ),
    ("What is the square root of 81?", "The square root of 81 is 9."),
    (
        "Which animal is called the king of the jungle?",
        "The lion is often called the king of the jungle.",
    ),
    ("What language is spoken in Brazil?", "The main language spoken in Brazil is Portuguese."),
    (
        "How do you reverse a list in Python?",
        "You can reverse a list with my_list.reverse() or my_list[::-1].",
    ),
    ("What is the freezing point of water?", "Water freezes at 0 degrees Celsius."),
    ("Name a mammal that can fly.", "The bat is a mammal that can fly."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("How many continents are there?", "There are seven continents."),
    (
        "What is the tallest mountain in the world?",
        "Mount Everest is the tallest mountain in the world.",
    ),
    (
        "Give an example of a renewable energy source.",
        "Solar power is an example of a renewable energy source.",
    ),
    ("What does CPU stand for?", "CPU stands for central processing unit."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("What is the main ingredient of guacamole?", "The main ingredient of guacamole is avocado."),
    ("How many minutes are in an hour?", "There are sixty minutes in an hour."),
    ("What is the smallest prime number?", "The smallest prime number is 2."),
    (
        "Write a haiku about the sea.",
        "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time.",
    ),
]


def chat_rows(tokenizer, n: int = 24) -> tuple[list[list[int]], list[list[int]]]:
    """``n`` token-id rows and loss masks from :data:`QA`, rendered with the chat template
    (loss mask 1 on the assistant answer, including its end token)."""
    rows, masks = [], []
    for i in range(n):
        q, a = QA[i % len(QA)]
        if i >= len(QA):  # vary repeated rows a little
            q = f"{q} (#{i // len(QA)})"
        prompt = [{"role": "user", "content": q}]
        p_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        full = tokenizer.apply_chat_template(
            [*prompt, {"role": "assistant", "content": a}], tokenize=True
        )
        p_ids, full = _ids(p_ids), _ids(full)
        if full[: len(p_ids)] != p_ids:
            raise AssertionError("chat template: prompt is not a prefix of the conversation")
        rows.append(list(full))
        masks.append([0] * len(p_ids) + [1] * (len(full) - len(p_ids)))
    return rows, masks


def _ids(x) -> list[int]:
    if isinstance(x, dict) or hasattr(x, "keys"):
        x = x["input_ids"]
    return [int(t) for t in x]


def compute_hidden_states(model, rows: list[list[int]], layer_ids: list[int]):
    """Yield ``[seq, len(layer_ids), hidden]`` float32 tensors, final layer (= N) last, exactly
    as the extract stage's reference check computes them."""
    import torch

    from eagle3_pipeline.hidden_states.checks import reference_hidden_states

    for row in rows:
        yield torch.stack(reference_hidden_states(model, row, layer_ids), dim=1).float()


def build(
    target_dir: str | Path,
    out_dir: str | Path,
    rows: list[list[int]],
    loss_masks: list[list[int]] | None = None,
    *,
    aux_layer_ids: list[int] | None = None,
    samples_per_shard: int = 8,
    storage: str = "bf16",
    draft_vocab_size: int = 1024,
    torch_format: bool = True,
) -> dict[str, Path]:
    """Write dataset, hidden states (+ manifest) and vocab map for ``rows``; return the paths.

    ``aux_layer_ids`` defaults to [2, N//2, N-3]; the final layer N is always appended.
    ``storage`` is ``bf16`` or ``fp8`` (per-token scaled, key ``hidden_states_scales``).
    """
    import numpy as np
    import torch
    from datasets import Dataset, Features, Sequence, Value
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    target_dir, out = Path(target_dir).resolve(), Path(out_dir).resolve()
    loss_masks = loss_masks or [[1] * len(r) for r in rows]
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model.eval()
    cfg = model.config
    n_layers, hidden, vocab = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    aux = aux_layer_ids or sorted({2, n_layers // 2, n_layers - 3})
    layer_ids = [*aux, n_layers]

    # --- hidden states in the shards layout -------------------------------------------------
    hs_root = out / "hidden_states"
    shards: dict[int, dict[str, Any]] = {}
    for i, h in enumerate(compute_hidden_states(model, rows, layer_ids)):
        s = i // samples_per_shard
        sdir = hs_root / "shards" / f"shard_{s:05d}"
        sdir.mkdir(parents=True, exist_ok=True)
        tensors = {"token_ids": torch.tensor(rows[i], dtype=torch.long)}
        if storage == "fp8":
            from hs_connectors.fp8_utils import quantize_tensor_to_fp8

            q, scales = quantize_tensor_to_fp8(h)
            tensors.update(hidden_states=q, hidden_states_scales=scales)
        elif storage == "bf16":
            tensors["hidden_states"] = h.to(torch.bfloat16)
        else:
            raise ValueError(f"storage must be bf16 or fp8, got {storage!r}")
        path = sdir / f"hs_{i}.safetensors"
        save_file(tensors, str(path))
        data = path.read_bytes()
        entry = shards.setdefault(
            s, {"index": s, "samples": [i, i], "tokens": 0, "bytes": 0, "files": {}}
        )
        entry["samples"][1] = i
        entry["tokens"] += len(rows[i])
        entry["bytes"] += len(data)
        entry["files"][path.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    shard_list = []
    for s, entry in sorted(shards.items()):
        sdir = hs_root / "shards" / f"shard_{s:05d}"
        seal = json.dumps(
            {"shard": s, "samples": entry["samples"], "files": entry["files"]}, indent=1
        )
        (sdir / "shard.json").write_text(seal)
        shard_list.append(
            {
                "index": s,
                "samples": entry["samples"],
                "tokens": entry["tokens"],
                "bytes": entry["bytes"],
                "sha256": hashlib.sha256(seal.encode()).hexdigest(),
            }
        )
    manifest = {
        "format": "eagle3-pipeline/hidden-states@1",
        "root": str(hs_root),
        "num_samples": len(rows),
        "samples_per_shard": samples_per_shard,
        "layer_ids": layer_ids,
        "aux_layer_ids": aux,
        "final_layer_id": n_layers,
        "hidden_size": hidden,
        "storage": storage,
        "target": {"model_path": str(target_dir), "num_layers": n_layers, "vocab_size": vocab},
        "shards": shard_list,
        "samples_sha256": samples_digest(
            [
                f["sha256"]
                for _, e in sorted(shards.items())
                for _, f in sorted(e["files"].items(), key=lambda kv: int(kv[0][3:].split(".")[0]))
            ]
        ),
        "verification": {"source": "tests/hidden_states_fixture.py (transformers forward)"},
        "provenance": {"fixture": True},
    }
    (hs_root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    # --- prepare-format dataset --------------------------------------------------------------
    features = Features(
        {
            "input_ids": Sequence(Value("int64")),
            "loss_mask": Sequence(Value("int64")),
            "seq_len": Value("int64"),
            "sample_id": Value("string"),
        }
    )
    ds = Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": loss_masks,
            "seq_len": [len(r) for r in rows],
            "sample_id": [f"s{i}" for i in range(len(rows))],
        },
        features=features,
    )
    if torch_format:
        ds.set_format(type="torch")
    ds_dir = out / "dataset"
    ds.save_to_disk(str(ds_dir))

    # --- vocab map ---------------------------------------------------------------------------
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq: dict[int, int] = {}
    for r, m in zip(rows, loss_masks, strict=True):
        for t, keep in zip(r, m, strict=True):
            if keep:
                freq[int(t)] = freq.get(int(t), 0) + 1
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, vocab)
    vdir = out / "vocab"
    vdir.mkdir(parents=True, exist_ok=True)
    np.save(vdir / "d2t.npy", d2t.numpy())
    np.save(vdir / "t2d.npy", t2d.numpy())
    torch.save(freq, vdir / "token_freq.pt")

    return {
        "dataset": ds_dir,
        "manifest": hs_root / "manifest.json",
        "hidden_states": hs_root,
        "d2t": vdir / "d2t.npy",
        "t2d": vdir / "t2d.npy",
    }
