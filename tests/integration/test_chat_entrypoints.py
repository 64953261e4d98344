"""HTTP ``/v1/chat/completions`` and gRPC ``Predict``/``StreamPredict`` are two doors to one chat pipeline: the
same request gets the same (filtered) text, one cache serves both, and an over-limit request gets the same
refusal from the same config key."""

from __future__ import annotations

import aiohttp
import grpc
import pytest

from server.grpc_api import inference_pb2 as pb
from server.grpc_api import inference_pb2_grpc as pb_grpc
from server.grpc_api.service import GRPC_SERVER
from server.v1.chat_service import CHAT_SERVICE
from tests.support.scripted_llm import ScriptedLlmForTest

PII_SCRIPT = ["Call me at 010-12", "34-5678 or write to bo", "b@exam", "ple.com. My number is 900101-1",
              "234567, thanks!"]
PII_MASKED = "Call me at [PHONE] or write to [EMAIL]. My number is [RRN], thanks!"
QUESTION = "How do I reach you?"


async def _http_chat(server, **body) -> tuple[int, dict, str]:
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}/v1/chat/completions", json=body) as reply:
        return reply.status, await reply.json(), reply.headers.get("X-Vigil-Cache", "")


async def test_http_and_grpc_share_one_chat_pipeline(vigil):
    server = await vigil(api={"max_output_tokens": 64, "cache": {"semantic": False}})
    model = server.settings.models.llm.model
    scripted = ScriptedLlmForTest(PII_SCRIPT, name=model)
    server.app[CHAT_SERVICE].use_llm_for_test(scripted)
    ask = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32, "temperature": 0}

    status, body, cache = await _http_chat(server, **ask)
    assert status == 200 and cache == "miss", body
    assert body["choices"][0]["message"]["content"] == PII_MASKED  # the content filter ran
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.app[GRPC_SERVER].port}") as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        same = pb.PredictRequest(prompt=QUESTION, model_id=model, max_tokens=32, temperature=0.0)
        predicted = await stub.Predict(same)
        assert predicted.text == PII_MASKED and predicted.finish_reason == "stop"
        assert len(scripted.requests) == 1  # gRPC was answered from the cache HTTP filled: one pipeline

        other = pb.PredictRequest(prompt="Anything else?", model_id=model, max_tokens=32)
        streamed = [t async for t in stub.StreamPredict(other)]
        assert "".join(t.token for t in streamed) == PII_MASKED and streamed[-1].is_finished
        assert len(scripted.requests) == 2 and scripted.requests[-1].max_tokens == 32

        # over api.max_output_tokens (64): the same refusal both ways
        status, body, _ = await _http_chat(server, **{**ask, "max_tokens": 65})
        assert status == 400 and body["error"]["param"] == "max_tokens"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Predict(pb.PredictRequest(prompt=QUESTION, model_id=model, max_tokens=65))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == body["error"]["message"] == "max_tokens must be between 1 and 64 (got 65)"
        assert len(scripted.requests) == 2  # neither reached the model
