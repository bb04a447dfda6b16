"""The pipeline's connector with vLLM's base-class ``get_finished_count`` (None) restored: what
a connector without the override does under tensor parallelism. For leak_probe.py and the
negative control of tests/test_tensor_parallel.py (no_override_plugin.py)."""

from eagle3_pipeline.hidden_states.connector import PipelineHiddenStatesConnector


class NoOverrideConnector(PipelineHiddenStatesConnector):
    def get_finished_count(self):
        return None  # KVOutputAggregator then expects one finished-sending report per rank
