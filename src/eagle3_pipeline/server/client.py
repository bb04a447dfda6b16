"""The one HTTP client for talking to vLLM (or any OpenAI-compatible server): the ``openai``
client, for the OpenAI routes as well as vLLM's own ``/health`` and ``/metrics``.

The async client sends its requests through aiohttp (``openai.DefaultAioHttpClient``), not the
default httpx transport, whose connection pool costs far more per request when many requests
are in flight (openai/openai-python#1596, encode/httpx#3215): synth, extraction and the bench
stage keep 8-64 requests in flight against a server that answers a hundred a second.

Retries are the client's own: ``max_retries`` attempts more, with exponential backoff and
jitter, on connection errors, timeouts and HTTP 408, 409, 429 and 5xx (and the server's
``retry-after``); other 4xx answers are final. Each stage chooses how many: synth its
``synth.retries``, health polls none (they poll anyway), the benchmark's measured requests none
(a retried request would distort the timing; a failure is an error). Extraction retries with
speculators' policy and its own per-attempt timeout (``extract.client.request_hidden_states``),
on a client built here with ``max_retries=0``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def _options(base_url: str, http_client_class, api_key, timeout, max_retries) -> dict:
    # A managed server on this host is reached directly, whatever proxy the environment names.
    # Any other server through the proxies the environment names (trust_env).
    local = urlsplit(base_url).hostname in ("127.0.0.1", "localhost", "::1")
    return {
        "base_url": base_url,
        "api_key": api_key or "EMPTY",
        "timeout": timeout,
        "max_retries": max_retries,
        "http_client": http_client_class(trust_env=not local),
    }


def async_client(
    base_url: str,
    *,
    api_key: str | None = None,
    timeout: float,
    max_retries: int,
    transport: str = "aiohttp",
) -> Any:
    """An ``openai.AsyncOpenAI`` for ``base_url`` (ending in ``/v1``), its requests sent
    through ``transport``: "aiohttp", or "httpx" (the openai client's default, which the
    throughput benchmarks measure beside it)."""
    import openai

    http_client_class = {
        "aiohttp": openai.DefaultAioHttpClient,
        "httpx": openai.DefaultAsyncHttpxClient,
    }[transport]
    opts = _options(base_url, http_client_class, api_key, timeout, max_retries)
    return openai.AsyncOpenAI(**opts)


def sync_client(
    base_url: str, *, api_key: str | None = None, timeout: float, max_retries: int
) -> Any:
    """An ``openai.OpenAI`` for ``base_url`` (ending in ``/v1``)."""
    import openai

    return openai.OpenAI(
        **_options(base_url, openai.DefaultHttpxClient, api_key, timeout, max_retries)
    )


async def chat(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    """POST a chat completion; the response as a plain dict, vLLM's extra fields included
    (``prompt_token_ids``, ``choices[i].token_ids``).

    The body goes out as it is and the answer comes back as parsed JSON, through the client's
    own request loop (its retries and errors stay), not through ``chat.completions.create``:
    the typed route transforms every request's parameters and builds a pydantic model of every
    answer, about 5 ms of CPU a request, which on a GPU server that answers a hundred requests
    a second is half of the client's one event-loop thread (docs/gpu.md)."""
    return await _post_json(client, "/chat/completions", body)


async def completion(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    """POST a completion, as :func:`chat` does: the body as it is, the answer as parsed JSON.
    For a prompt of token ids the typed route's transform is the costly part: it walks the
    list once per type of its union, a coroutine per token."""
    return await _post_json(client, "/completions", body)


async def _post_json(client: Any, route: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    response = await client.post(route, body=body, cast_to=httpx.Response)
    return response.json()


def get_text(client: Any, path: str) -> str:
    """GET one of the server's own routes (``/health``, ``/metrics``: outside ``/v1``)."""
    import httpx

    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    return client.get(f"{root}{path}", cast_to=httpx.Response).text
