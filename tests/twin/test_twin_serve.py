"""The OpenAI-compatible endpoint: completions, chat streaming, usage, models, metrics, multi-turn reuse."""

import json
import threading
import urllib.request

import pytest

from twin.config import load_config
from twin.serve import render_chat, serve


@pytest.fixture()
def endpoint():
    httpd, sim = serve(load_config(None), port=0, time_scale=0.01)  # 100x faster than real time
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", sim
    httpd.shutdown()
    httpd.server_close()
    sim.stop()


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


def test_completion_counts_tokens_and_returns_usage(endpoint):
    base, sim = endpoint
    out = json.loads(post(f"{base}/v1/completions", {"model": "m", "prompt": "Hello there, how are you?",
                                                      "max_tokens": 7}))
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 7, "total_tokens": 14}
    assert out["choices"][0]["text"] == " tok" * 7 and out["choices"][0]["finish_reason"] == "length"
    ids = json.loads(post(f"{base}/v1/completions", {"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 2}))
    assert ids["usage"]["prompt_tokens"] == 4
    models = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=10).read())
    assert models["data"][0]["id"] == "meta-llama/Llama-3.1-8B"


def test_chat_stream_then_second_turn_hits_the_prefix_cache(endpoint):
    base, sim = endpoint
    history = [{"role": "system", "content": "You are terse. " * 60}, {"role": "user", "content": "Hi"}]
    text = post(f"{base}/v1/chat/completions", {"model": "m", "messages": history, "max_tokens": 20, "stream": True,
                                                 "stream_options": {"include_usage": True}})
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert content == " tok" * 20 and chunks[-1]["usage"]["completion_tokens"] == 20
    history += [{"role": "assistant", "content": content}, {"role": "user", "content": "More please"}]
    assert render_chat(history).startswith(render_chat(history[:2]) + content)
    post(f"{base}/v1/chat/completions", {"model": "m", "messages": history, "max_tokens": 4})
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    hits = next(line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))
    assert int(hits.rsplit(" ", 1)[1]) >= 16 * 8  # the first turn's prompt and reply blocks were reused


def test_bad_request_is_a_400(endpoint):
    base, _ = endpoint
    with pytest.raises(urllib.error.HTTPError) as info:
        post(f"{base}/v1/chat/completions", {"model": "m", "messages": []})
    assert info.value.code == 400
