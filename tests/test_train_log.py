"""A train job's log split into epochs, validation and its servers' start (eagle3_lab.train_log),
on lines as an online job on a GPU wrote them."""

from __future__ import annotations

from eagle3_lab.train_log import phase_seconds

ONLINE_JOB = """\
21:45:23 INFO eagle3_pipeline.server: starting vLLM server on 127.0.0.1:49783
(APIServer pid=9642) INFO 12-05 21:45:36 [api_utils.py:345] version 0.26.0
21:45:59 INFO eagle3_pipeline.server: vLLM server ready after 35 s (model /tmp/target)
21:46:15 INFO speculators: Training epoch 1/2 started
21:46:46 INFO speculators.metrics: train/loss_0=10.9030
21:46:56 INFO speculators: Training epoch 1/2 completed
21:46:56 INFO speculators: Validation epoch 1/2 started
21:47:18 INFO speculators: Validation epoch 1/2 completed
21:47:18 INFO speculators: Training epoch 2/2 started
21:48:01 INFO speculators: Training epoch 2/2 completed
21:48:01 INFO speculators: Validation epoch 2/2 started
21:48:20 INFO speculators: Validation epoch 2/2 completed
"""


def test_each_epoch_and_validation_takes_the_seconds_between_its_lines():
    assert phase_seconds(ONLINE_JOB) == {
        "epoch_s": [41.0, 43.0],
        "val_s": [22.0, 19.0],
        "server_ready_s": [35.0],
    }


def test_an_epoch_across_midnight_and_an_unfinished_one():
    text = (
        "23:59:50 INFO speculators: Training epoch 1/2 started\n"
        "00:00:20 INFO speculators: Training epoch 1/2 completed\n"
        "00:00:21 INFO speculators: Training epoch 2/2 started\n"  # killed: no completed line
    )
    assert phase_seconds(text) == {"epoch_s": [30.0], "val_s": [], "server_ready_s": []}


def test_a_stored_job_has_no_server_and_engine_lines_are_not_read_as_phases():
    text = (
        "(EngineCore pid=1) INFO 12-05 21:45:54 Training epoch 1/1 started\n"
        "10:00:00 INFO speculators: Training epoch 1/1 started\n"
        "10:00:04 INFO speculators: Training epoch 1/1 completed\n"
    )
    assert phase_seconds(text) == {"epoch_s": [4.0], "val_s": [], "server_ready_s": []}
