"""What every benchmark result file records beside its figures: the revision of the checkout
that made them (``code``: ``git describe`` and whether the tree had uncommitted changes, as in
every stage output's provenance), so that a figure is traced to its code from the file alone;
a dirty tree's figures are those of no commit."""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.runtime.files import write_json
from eagle3_pipeline.runtime.provenance import code_version


def write_result(path, result: dict[str, Any]) -> dict[str, Any]:
    """Write ``result`` with ``code`` (:func:`code_version`) as JSON to ``path``; return it."""
    recorded = {**result, "code": code_version()}
    write_json(path, recorded)
    return recorded
