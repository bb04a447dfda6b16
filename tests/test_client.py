"""The one HTTP client (eagle3_pipeline.server.client) against a real local HTTP server: its retries
(transient errors are retried with backoff, a refusal is final) as synth uses them."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time

import pytest

from eagle3_pipeline.server import Endpoint, ServerError, external_endpoint
from eagle3_pipeline.synth import client as synth_client

ANSWER = {
    "id": "c",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "token_ids": [4, 5],
            "message": {"role": "assistant", "content": "hi", "reasoning_content": None},
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


@pytest.fixture
def server():
    """A local server answering with the statuses queued in ``server.statuses`` (then 200)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def reply(self, status, payload):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            srv.requests.append((self.path, body))
            time.sleep(srv.delays.pop(0) if srv.delays else 0)
            status = srv.statuses.pop(0) if srv.statuses else 200
            self.reply(status, ANSWER if status == 200 else {"error": {"message": "no"}})

        def do_GET(self):
            self.reply(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.requests, srv.statuses, srv.delays = [], [], []
    srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


CFG = {
    "max_tokens": 8,
    "temperature": 0.0,
    "top_p": 1.0,
    "seed": 0,
    "chat_template_kwargs": {"enable_thinking": False},
    "retries": 2,
    "request_timeout_s": 30,
    "concurrency": 1,
}
PROMPT = {"id": "p1", "messages": [{"role": "user", "content": "hello"}]}


def answer(srv, transport="aiohttp", **cfg):
    from eagle3_pipeline.server import client as client_lib

    async def go():
        c = {**CFG, **cfg}
        async with client_lib.async_client(
            srv.base_url,
            timeout=c["request_timeout_s"],
            max_retries=c["retries"],
            transport=transport,
        ) as client:
            return await synth_client.answer(client, Endpoint(srv.base_url, "m"), PROMPT, c)

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_transient_errors_are_retried_and_vllm_fields_travel(server, transport):
    server.statuses = [503, 500]
    rec = answer(server, transport)
    assert rec["prompt_token_ids"] == [1, 2, 3] and rec["completion_token_ids"] == [4, 5]
    assert len(server.requests) == 3  # two retries
    path, body = server.requests[-1]
    assert path == "/v1/chat/completions"
    assert body["return_token_ids"] is True and body["chat_template_kwargs"]
    assert body["messages"] == PROMPT["messages"] and body["max_tokens"] == 8


def test_the_async_client_sends_through_aiohttp_and_times_out_as_a_transient_error(server):
    """aiohttp, not httpx's pool (the costlier one with many requests in flight), and its
    read timeout is the client's: a request that outlasts it is retried, then Transient."""
    import openai

    from eagle3_pipeline.server import client as client_lib

    client = client_lib.async_client(server.base_url, timeout=1, max_retries=0)
    assert isinstance(client._client, openai.DefaultAioHttpClient)
    server.delays = [3, 3]
    t0 = time.monotonic()
    with pytest.raises(synth_client.Transient, match="Timeout"):
        answer(server, request_timeout_s=0.5, retries=1)
    assert len(server.requests) == 2 and time.monotonic() - t0 < 2.9


def test_retries_run_out_and_refusals_are_final(server):
    server.statuses = [503, 503, 503]
    with pytest.raises(synth_client.Transient, match="HTTP 503"):
        answer(server)
    assert len(server.requests) == 3
    server.requests.clear()
    server.statuses = [400]
    with pytest.raises(synth_client.Rejected, match="HTTP 400"):
        answer(server)
    assert len(server.requests) == 1  # a refusal is not retried


def test_external_endpoint_lists_models(server):
    assert external_endpoint(server.base_url).model == "m"
    with pytest.raises(ServerError, match="serves \\['m'\\], not 'x'"):
        external_endpoint(server.base_url, model="x")
