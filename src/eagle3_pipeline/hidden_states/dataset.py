"""The thin adapter between our hidden-states layout and speculators' own dataset.

speculators reads hidden states through an ``hs_connectors.HiddenStatesBackend`` chosen by
name (``--hidden-states-backend``). Its stock ``file`` backend wants every sample as
``<dir>/hs_<i>.safetensors`` in one flat directory; extraction writes them sharded
(``eagle3_pipeline.hidden_states.shards``) and optionally in fp8. This module registers backend
:data:`BACKEND_NAME`, whose transfer maps sample ``i`` to its shard file and dequantizes fp8
exactly as hs_connectors' ``FP8Transfer`` does. Everything else (packing, shifting, masks) stays
speculators' ``ArrowDataset``/``CollateFn``.

One extraction serves several drafter methods: the files hold the union of their aux layers
(manifest ``layer_ids``) and the final layer, and speculators' dataset takes every column but
the last as the aux layers (``hidden_states[:, :-1]``, train/data.py). So the transfer keeps,
for the training job at hand, only the columns of its ``target_layer_ids`` and the final one
(:func:`layer_columns`); for a job that trains on every extracted layer nothing is copied.

The transfer object is pickled into spawned DataLoader workers, so it lives in this importable
module and holds only plain values. Importing this module registers the backend (idempotent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hs_connectors import HiddenStatesBackend, HiddenStatesTransfer
from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor
from hs_connectors.transfer import _add_argument_if_absent

from ..runtime.results import HIDDEN_STATES, check_format
from .shards import sample_path

BACKEND_NAME = "eagle3-pipeline-shards"


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of a hidden-states directory (``<root>/manifest.json``), checked."""
    path = Path(root) / "manifest.json"
    manifest = check_format(json.loads(path.read_text()), path, HIDDEN_STATES)
    for key in (
        "samples_per_shard",
        "layer_ids",
        "aux_layer_ids",
        "final_layer_id",
        "hidden_size",
        "storage",
        "num_samples",
    ):
        if key not in manifest:
            raise ValueError(f"{path}: missing key {key!r}")
    return manifest


def layer_columns(manifest: dict[str, Any], aux_layer_ids: list[int]) -> list[int] | None:
    """The file columns of ``aux_layer_ids`` and of the final layer, in that order; None when
    that is every column in file order (nothing to select)."""
    layer_ids = list(manifest["layer_ids"])
    missing = [i for i in aux_layer_ids if i not in layer_ids[:-1]]
    if missing:
        raise ValueError(
            f"layers {missing} were not extracted (the hidden states hold {layer_ids}): add "
            "them to the extraction (extract.layer_ids or the method's layer_ids) and re-run it"
        )
    cols = [layer_ids.index(i) for i in aux_layer_ids] + [len(layer_ids) - 1]
    return None if cols == list(range(len(layer_ids))) else cols


def training_sample(
    tensors: dict[str, Any], dequantize_dtype: str, columns: list[int] | None
) -> dict[str, Any]:
    """A sample file's tensors as speculators' dataset takes them: fp8 dequantized to
    ``dequantize_dtype`` exactly as hs_connectors' ``FP8Transfer`` does, the layers of
    ``columns`` (:func:`layer_columns`; None: all). ``tensors`` is changed in place."""
    if SCALES_KEY in tensors:
        import torch

        scales = tensors.pop(SCALES_KEY)
        tensors["hidden_states"] = dequantize_fp8_tensor(
            tensors["hidden_states"], scales, dtype=getattr(torch, dequantize_dtype)
        )
    if columns is not None:
        tensors["hidden_states"] = tensors["hidden_states"][:, columns].contiguous()
    return tensors


class ShardedTransfer(HiddenStatesTransfer):
    """Reads ``shards/shard_<s>/hs_<i>.safetensors`` under ``root``; fp8 files are
    dequantized to ``dequantize_dtype`` (the collate function casts to the training dtype);
    ``columns`` selects layers (:func:`layer_columns`)."""

    def __init__(
        self,
        root: str | Path,
        samples_per_shard: int,
        num_samples: int,
        dequantize_dtype: str = "bfloat16",
        columns: list[int] | None = None,
    ):
        self.root = str(root)
        self.samples_per_shard = int(samples_per_shard)
        self.num_samples = int(num_samples)
        self.dequantize_dtype = dequantize_dtype
        self.columns = columns

    def path(self, file_idx: int) -> Path:
        return sample_path(self.root, file_idx, self.samples_per_shard)

    def get_cached(self, file_idx: int) -> dict[str, Any] | None:
        from safetensors.torch import load_file

        if not 0 <= file_idx < self.num_samples:
            return None
        path = self.path(file_idx)
        if not path.exists():
            return None
        return training_sample(load_file(str(path)), self.dequantize_dtype, self.columns)

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> None:
        raise RuntimeError(
            f"backend {BACKEND_NAME!r} only reads extracted hidden states; sample missing "
            f"under {self.root} (run the extract stage; train with on_missing=raise)"
        )


class PathBackend(HiddenStatesBackend):
    """A backend of the pipeline's, read from ``--hidden-states-path`` (:attr:`path_help`); its
    launch side is the pipeline's own (the extract stage, or the train stage's servers)."""

    path_help = ""

    @classmethod
    def add_train_args(cls, parser) -> None:
        # the dest the stock file/fp8 backends share (speculators de-duplicates by dest)
        _add_argument_if_absent(
            parser, "--hidden-states-path", type=str, default=None, help=cls.path_help
        )

    @staticmethod
    def add_launch_args(parser) -> None:
        _add_argument_if_absent(parser, "--hidden-states-path", type=str, default=None)

    @staticmethod
    def root_and_dtype(args, name: str) -> tuple[Path, str]:
        """The training arguments every path backend reads: its root, the dtype to train in."""
        root = getattr(args, "hidden_states_path", None)
        if not root:
            raise ValueError(f"backend {name!r} needs hidden_states_path")
        return Path(root), getattr(args, "hidden_states_dtype", "bfloat16") or "bfloat16"


class ShardedBackend(PathBackend):
    """``--hidden-states-backend eagle3-pipeline-shards --hidden-states-path <root>``:
    ``<root>`` holds ``manifest.json`` (samples_per_shard, storage) and ``shards/``."""

    path_help = "hidden-states root holding manifest.json and shards/"

    @staticmethod
    def from_train_args(args, data_path: str) -> ShardedTransfer:
        root, dtype = PathBackend.root_and_dtype(args, BACKEND_NAME)
        manifest = read_manifest(root)
        aux = getattr(args, "target_layer_ids", None) or manifest["aux_layer_ids"]
        return ShardedTransfer(
            root,
            manifest["samples_per_shard"],
            manifest["num_samples"],
            dequantize_dtype=dtype,
            columns=layer_columns(manifest, [int(i) for i in aux]),
        )

    @staticmethod
    def build_kv_transfer_config(args) -> dict[str, Any]:
        raise NotImplementedError("the pipeline's extract stage configures vLLM itself")


def register_backend(name: str, backend: type[HiddenStatesBackend]) -> type[HiddenStatesBackend]:
    """Register ``backend`` under ``name`` with speculators' hidden-states backends
    (idempotent: a name registered to another class is taken over)."""
    registry = HiddenStatesBackend.registry
    if registry.get(name) is not backend:
        registry.pop(name, None)
        HiddenStatesBackend.register(name)(backend)
    return backend


def register() -> type[HiddenStatesBackend]:
    """Register :class:`ShardedBackend` under :data:`BACKEND_NAME` (idempotent)."""
    return register_backend(BACKEND_NAME, ShardedBackend)


register()
