"""The OpenAI-compatible request checks and response bodies, with vLLM's error shapes and status codes."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from simulator import tokenizer
from simulator.config import EngineConfig


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


@dataclass
class ParsedRequest:
    kind: str  # completion | chat
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    n: int
    request_id: str


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(
            f"[{{'type': 'json_invalid', 'loc': ('body', {exc.pos if hasattr(exc, 'pos') else 0}), "
            "'msg': 'JSON decode error', 'input': {}, 'ctx': {'error': "
            f"{str(exc.args[0]) if exc.args else 'invalid'!r}}}}}]"
        ) from None
    if not isinstance(body, dict):
        raise _bad(
            "[{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid "
            "dictionary or object to extract fields from'}]"
        )
    return body


def _int_field(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(
            f"[{{'type': 'int_type', 'loc': ('body', '{name}'), 'msg': 'Input should be a valid integer', "
            f"'input': {v!r}}}]",
            name,
        )
    return v


def parse_request(kind: str, body: dict[str, Any], cfg: EngineConfig) -> ParsedRequest:
    model = body.get("model")
    if model is not None and model != cfg.served_model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = [int(t) for t in prompt]
        elif prompt is None:
            raise _bad("[{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required'}]", "prompt")
        else:
            raise _bad("kvscope sim accepts one prompt per request: a string or a list of token ids", "prompt")
    else:
        try:
            ids = tokenizer.encode_chat(body.get("messages"))
        except ValueError as exc:
            raise _bad(str(exc), "messages") from None
    if not ids:
        raise _bad("Prompt cannot be empty", "prompt")
    n = _int_field(body, "n") or 1
    if n != 1:
        raise _bad("kvscope sim serves n=1 only", "n")
    max_tokens = _int_field(body, "max_completion_tokens") if kind == "chat" else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    plen = len(ids)
    max_len = cfg.max_model_len
    if plen > max_len or (plen == max_len and max_tokens is None):
        raise _bad(
            f"This model's maximum context length is {max_len} tokens. However, your request has "
            f"{plen} input tokens. Please reduce the length of the input messages."
        )
    if max_tokens is None:
        max_tokens = 16 if kind == "completion" else max_len - plen
    if max_tokens < 1:
        raise _bad(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if plen + max_tokens > max_len:
        raise _bad(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_len} tokens and your request has {plen} input tokens "
            f"({max_tokens} > {max_len} - {plen}).",
            "max_tokens",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(
            "[{'type': 'bool_type', 'loc': ('body', 'stream'), 'msg': 'Input should be a valid boolean'}]", "stream"
        )
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    if opts and not stream:
        raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
    prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
    return ParsedRequest(kind, ids, max_tokens, stream, include_usage, n, prefix + uuid.uuid4().hex)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def full_response(req: ParsedRequest, model: str, text: str, n_out: int) -> dict[str, Any]:
    created = int(time.time())
    if req.kind == "completion":
        return {
            "id": req.request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            ],
            "usage": usage(len(req.prompt_ids), n_out),
            "kv_transfer_params": None,
        }
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": usage(len(req.prompt_ids), n_out),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def stream_chunk(
    req: ParsedRequest, model: str, piece: str | None, finish: str | None, first: bool = False
) -> dict[str, Any]:
    created = int(time.time())
    if req.kind == "completion":
        return {
            "id": req.request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish, "stop_reason": None}
            ],
        }
    delta: dict[str, Any] = {"content": piece or ""}
    if first:
        delta = {"role": "assistant", "content": ""}
    return {
        "id": req.request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                **({"stop_reason": None} if finish else {}),
            }
        ],
    }


def usage_chunk(req: ParsedRequest, model: str, n_out: int) -> dict[str, Any]:
    obj = "text_completion" if req.kind == "completion" else "chat.completion.chunk"
    return {
        "id": req.request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(len(req.prompt_ids), n_out),
    }


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
