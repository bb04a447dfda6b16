"""The extraction client: send rows, check and store what comes back.

A request slot (``extract.concurrency``) is held only while the server prefills: the
returned file goes to the validator (:mod:`.validator`) and the slot takes the next row. At
most twice ``concurrency`` samples wait for their checks, so a slow validator slows the
requests instead of piling staged files up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..hidden_states.checks import NextTokenProbe, VerificationError
from ..runtime import Progress, for_each
from ..server import client as client_lib
from .book import ShardBook
from .capture import ExtractError
from .validator import ProbeBatcher, Timings, take_sample, wait_written, written_now

log = logging.getLogger(__name__)

# Python hands its interpreter lock from thread to thread at most every 5 ms
# (sys.getswitchinterval). With the request loop busy, a validator thread then waits up to
# that long each time a read or a torch op gives the lock back and wants it again, a dozen
# times a sample (benchmarks/validator_cost.py --busy-thread). The extraction job runs nothing
# else in its process, so it switches more often while it extracts.
SWITCH_INTERVAL_S = 0.0005


class Extractor:
    """Send rows, verify and store what comes back."""

    def __init__(
        self,
        dataset,
        book: ShardBook,
        probe: NextTokenProbe,
        layer_ids: list[int],
        hidden: int,
        cfg: dict,
        staging: Path,
        switch_interval_s: float | None = SWITCH_INTERVAL_S,
        request=None,
        transport: str = "aiohttp",
        wait_in_validator: bool = False,
    ):
        """``switch_interval_s``: the interpreter's switch interval while it runs (None:
        leave Python's); ``request``: how a row is sent (default
        :func:`request_hidden_states`); ``transport``: the HTTP client's
        (:func:`client.async_client`); ``wait_in_validator``: a validator thread waits for
        the server to finish writing a sample instead of a waiting thread of its own. The
        benchmarks compare the alternatives."""
        self.ds, self.book, self.probe = dataset, book, probe
        self.switch_interval_s = switch_interval_s
        self.request = request or request_hidden_states
        self.transport = transport
        self.wait_in_validator = wait_in_validator
        self.layer_ids, self.hidden, self.cfg, self.staging = layer_ids, hidden, cfg, staging
        self.hits = self.checked = 0
        self.failures: list[dict] = []
        self._timings = Timings()
        self.probe_batches = 0

    @property
    def timings(self) -> dict[str, float]:
        """Validator seconds per phase (all samples; threads overlap)."""
        return dict(self._timings.seconds)

    def check(self, index: int, staged: str, written: bool = False):
        """Check a staged sample and move it into its shard (runs in a worker thread)."""
        return take_sample(
            staged,
            index,
            self.ds[index],
            len(self.layer_ids),
            self.hidden,
            self.cfg["agreement_positions_per_sample"],
            self.book.root,
            self.book.S,
            self._timings,
            written,
        )

    async def run(
        self, base_url: str, model: str, todo: list[int], progress: Progress, check_alive
    ) -> None:
        import torch

        loop = asyncio.get_running_loop()
        failures_in_a_row = 0
        waiting = asyncio.Semaphore(2 * self.cfg["concurrency"])
        validating: set[asyncio.Task] = set()
        errors: list[BaseException] = []

        def failed(index: int, e: Exception) -> None:
            nonlocal failures_in_a_row
            check_alive()
            failures_in_a_row += 1
            self.failures.append({"index": index, "error": f"{type(e).__name__}: {e}"})
            log.warning("sample %d failed: %s", index, e)
            if failures_in_a_row >= max(8, self.cfg["concurrency"]):
                raise ExtractError(f"{failures_in_a_row} samples in a row failed (last: {e})")

        async def validate(index: int, staged: str) -> None:
            nonlocal failures_in_a_row
            try:
                # a sample written by the time its answer is read goes straight to the
                # validator pool, without a hop through a waiting thread
                written = waiters is not None
                if written and not written_now(staged):
                    await loop.run_in_executor(waiters, wait_written, staged, self._timings)
                checked = await loop.run_in_executor(pool, self.check, index, staged, written)
                hits = await batcher.hits(checked.rows, checked.targets)
            except VerificationError as e:
                raise ExtractError(
                    f"sample {index}: {e}. The extracted hidden states are "
                    "wrong; nothing of this sample was kept."
                ) from e
            except Exception as e:
                failed(index, e)
                return
            finally:
                waiting.release()
            failures_in_a_row = 0
            entry = {**checked.entry, "agree": [hits, len(checked.targets)]}
            self.book.record(entry)
            self.hits += hits
            self.checked += len(checked.targets)
            progress.update(1, extra=entry["tokens"])

        def validated(task: asyncio.Task) -> None:
            validating.discard(task)
            if not task.cancelled() and task.exception() is not None and not errors:
                errors.append(task.exception())  # the next request slot raises it

        async def one(client, index: int) -> None:
            await waiting.acquire()
            if errors:  # a sample failed its checks: the job ends
                waiting.release()
                raise errors[0]
            try:
                staged = await self.request(
                    client,
                    model,
                    self.ds[index]["input_ids"],
                    timeout=self.cfg["request_timeout_s"],
                    max_retries=self.cfg["retries"],
                )
            except Exception as e:
                waiting.release()
                failed(index, e)
                return
            task = asyncio.create_task(validate(index, staged))
            validating.add(task)
            task.add_done_callback(validated)

        # A few validator threads with one torch thread each: more would oversubscribe the
        # cores the server needs (on the CPU) without validating faster. Waiting for the
        # server to finish writing a sample takes no CPU but took a third of a validator
        # thread's time at the 8B shape on an H200 (docs/results.md, engine efficiency):
        # threads of their own wait, one for each sample that may be outstanding.
        threads, switch = torch.get_num_threads(), sys.getswitchinterval()
        torch.set_num_threads(1)
        if self.switch_interval_s:
            sys.setswitchinterval(self.switch_interval_s)
        pool = ThreadPoolExecutor(
            max(1, min(self.cfg["concurrency"], (os.cpu_count() or 2) // 2)),
            thread_name_prefix="validate",
        )
        waiters = None
        if not self.wait_in_validator:
            waiters = ThreadPoolExecutor(2 * self.cfg["concurrency"], thread_name_prefix="wait")
        probe_pool = ThreadPoolExecutor(1, thread_name_prefix="probe")
        batcher = ProbeBatcher(self.probe, probe_pool, self._timings)
        try:
            # request_hidden_states retries (extract.retries) with its own per-attempt
            # timeout: the client itself does not retry on top of it
            client = client_lib.async_client(
                base_url,
                timeout=self.cfg["request_timeout_s"],
                max_retries=0,
                transport=self.transport,
            )
            async with client:
                await for_each(todo, lambda i: one(client, i), self.cfg["concurrency"])
                while validating:
                    await asyncio.gather(*validating)
            if errors:
                raise errors[0]
        finally:
            for task in list(validating):
                task.cancel()
            await asyncio.gather(*validating, return_exceptions=True)
            pool.shutdown(wait=True)
            if waiters is not None:
                waiters.shutdown(wait=True)
            probe_pool.shutdown(wait=True)
            self.probe_batches = batcher.batches
            torch.set_num_threads(threads)
            sys.setswitchinterval(switch)


async def request_hidden_states(
    client, model: str, input_ids: list[int], *, timeout: float, max_retries: int
) -> str:
    """The staged file of one row's hidden states: speculators' ``generate_hidden_states_async``
    for token ids (a 1-token completion; its retries: backoff, a wrong answer final) with the
    request and the answer as plain JSON (:func:`client.completion`). The typed route spends
    milliseconds of the event loop's interpreter lock on every request, which the validator
    threads need."""
    from speculators.data_generation.vllm_client import with_retries

    async def once() -> str:
        body = {"model": model, "prompt": input_ids, "max_tokens": 1, "return_token_ids": True}
        async with asyncio.timeout(timeout):
            answer = await client_lib.completion(client, body)
        return staged_path(answer, input_ids)

    return await with_retries(once)(max_retries=max_retries)


def staged_path(answer: dict, input_ids: list[int]) -> str:
    """Where the server staged the hidden states of ``input_ids``, from its completion answer,
    checked as speculators' ``extract_output`` checks it (InvalidResponseError: not retried)."""
    from speculators.data_generation.vllm_client import InvalidResponseError

    choices = answer.get("choices") or [{}]
    prompt_ids = choices[0].get("prompt_token_ids")
    if prompt_ids is None:
        raise InvalidResponseError("Response missing prompt_token_ids")
    if prompt_ids != input_ids:
        raise InvalidResponseError(
            f"Prompt token IDs mismatch: expected {len(input_ids)} tokens, got "
            f"{len(prompt_ids)} (first difference at {_first_difference(prompt_ids, input_ids)})"
        )
    params = answer.get("kv_transfer_params")
    if params is None:
        raise InvalidResponseError("Response missing kv_transfer_params")
    path = params.get("hidden_states_path") or params.get("handle")
    if path is None:
        raise InvalidResponseError(
            "Response kv_transfer_params missing both 'hidden_states_path' and 'handle'"
        )
    return path


def _first_difference(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
