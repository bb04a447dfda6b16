"""Target stage: the target model materialized as an HF directory, and the facts of it that
later stages need (:mod:`.stage`)."""

from .stage import (
    architecture,
    chat_template_text,
    default_layer_ids,
    defining_files,
    identity,
    load_info,
    materialize,
)

__all__ = [
    "architecture",
    "chat_template_text",
    "default_layer_ids",
    "defining_files",
    "identity",
    "load_info",
    "materialize",
]
