"""pytest plugin for the negative control of tests/test_tensor_parallel.py: every extraction in
the session uses the connector without the ``get_finished_count`` override
(no_override_connector.py), so the TP=3 extraction must stall and the test fail:

    PYTHONPATH=$PWD/src:$PWD/lab/tp_cpu .venv/bin/pytest -p no_override_plugin \
        tests/test_tensor_parallel.py -k extraction
"""

import pytest


@pytest.fixture(autouse=True)
def _no_override_connector(monkeypatch):
    from eagle3_pipeline.extract import capture as plan  # where server_spec reads them

    monkeypatch.setattr(plan, "CONNECTOR", "NoOverrideConnector")
    monkeypatch.setattr(plan, "CONNECTOR_MODULE", "no_override_connector")
