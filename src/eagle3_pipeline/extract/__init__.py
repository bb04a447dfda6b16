"""Extract stage: hidden states of the training rows from the target, through vLLM.

One job per part of the rows (``extract.jobs``; one model load each). A part starts a vLLM
server with the ``extract_hidden_states`` speculative method and a KV connector
(``vllm_connector``), sends every row's token ids as a 1-token completion (speculators'
client), verifies each returned sample (shape, ids, finite, next-token agreement), moves it
into its shard and journals it. Shards are sealed with a checksum list once complete; the part
manifest is written last. A re-run keeps every sample whose file still matches its checksum
and redoes the rest; a change of inputs or parameters discards the part's shards.

- :mod:`.capture`: layers, row keys, capture fingerprint, server spec;
- :mod:`.book`: which samples are done (shards, journals, the reuse pool, the layout);
- :mod:`.validator`: a returned sample's checks, off the request path, and the batched probe;
- :mod:`.client`: the requests (:class:`Extractor`);
- :mod:`.stage`: one part (:func:`run_part`), the thresholds, and :func:`gather`.
"""

from ..hidden_states.checks import NextTokenProbe
from .book import REUSE, ShardBook, intact, reset_layout, shard_entries, to_pool
from .capture import (
    CAPTURE_FORMAT,
    CONNECTOR,
    CONNECTOR_MODULE,
    ExtractError,
    LayerIdError,
    capture_fingerprint,
    resolve_layers,
    row_key,
    server_spec,
)
from .client import Extractor
from .stage import enforce, gather, maybe_reference, run_part

__all__ = [
    "CAPTURE_FORMAT",
    "CONNECTOR",
    "CONNECTOR_MODULE",
    "REUSE",
    "ExtractError",
    "Extractor",
    "LayerIdError",
    "NextTokenProbe",
    "ShardBook",
    "capture_fingerprint",
    "enforce",
    "gather",
    "intact",
    "maybe_reference",
    "reset_layout",
    "resolve_layers",
    "row_key",
    "run_part",
    "server_spec",
    "shard_entries",
    "to_pool",
]
