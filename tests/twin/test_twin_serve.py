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


def assert_refused(endpoint, route, body, message):
    """``body`` (with max_tokens 2) posted to ``route`` is a 400 whose text holds ``message``; nothing is
    simulated."""
    base, sim = endpoint
    with pytest.raises(urllib.error.HTTPError) as info:
        post(f"{base}/v1/{route}", {"max_tokens": 2, **body})
    assert info.value.code == 400 and message in info.value.read().decode()
    assert not sim.requests


def test_completion_counts_tokens_and_returns_usage(endpoint):
    base, sim = endpoint
    out = json.loads(post(f"{base}/v1/completions", {"prompt": "Hello there, how are you?",
                                                      "max_tokens": 7}))
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 7, "total_tokens": 14}
    assert out["choices"][0]["text"] == " tok" * 7 and out["choices"][0]["finish_reason"] == "length"
    ids = json.loads(post(f"{base}/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 2}))
    assert ids["usage"]["prompt_tokens"] == 4
    models = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=10).read())
    assert models["data"][0]["id"] == "meta-llama/Llama-3.1-8B"
    queried = json.loads(urllib.request.urlopen(f"{base}/v1/models?limit=1", timeout=10).read())  # was a 404
    assert queried == models


def test_chat_stream_then_second_turn_hits_the_prefix_cache(endpoint):
    base, sim = endpoint
    history = [{"role": "system", "content": "You are terse. " * 60}, {"role": "user", "content": "Hi"}]
    text = post(f"{base}/v1/chat/completions", {"messages": history, "max_tokens": 20, "stream": True,
                                                 "stream_options": {"include_usage": True}})
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert content == " tok" * 20 and chunks[-1]["usage"]["completion_tokens"] == 20
    history += [{"role": "assistant", "content": content}, {"role": "user", "content": "More please"}]
    assert render_chat(history).startswith(render_chat(history[:2]) + content)
    post(f"{base}/v1/chat/completions", {"messages": history, "max_tokens": 4})
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    hits = next(line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))
    assert int(hits.rsplit(" ", 1)[1]) >= 16 * 8  # the first turn's prompt and reply blocks were reused


def test_continuous_usage_stats_put_each_choices_usage_so_far_in_every_chunk(endpoint):
    """As vLLM: stream_options.continuous_usage_stats (with include_usage) adds usage to every token chunk,
    counting that choice's tokens so far; without include_usage it adds nothing, and plain include_usage
    only the final usage chunk."""
    base, _ = endpoint

    def chunks(options, n=1):
        text = post(f"{base}/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "stream": True, "n": n,
                                                "stream_options": options})
        return [json.loads(line[6:]) for line in text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]

    both = chunks({"include_usage": True, "continuous_usage_stats": True}, n=2)
    per_choice = {0: [], 1: []}
    for c in both[:-1]:
        per_choice[c["choices"][0]["index"]].append(c["usage"])
    assert per_choice[0] == per_choice[1] == [{"prompt_tokens": 3, "completion_tokens": k, "total_tokens": 3 + k}
                                              for k in (1, 2, 3)]
    assert both[-1]["choices"] == [] and both[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 6,
                                                               "total_tokens": 9}
    assert not any("usage" in c for c in chunks({"continuous_usage_stats": True}))
    plain = chunks({"include_usage": True})
    assert not any("usage" in c for c in plain[:-1]) and plain[-1]["usage"]["completion_tokens"] == 3


def test_bad_request_is_a_400(endpoint):
    base, _ = endpoint
    with pytest.raises(urllib.error.HTTPError) as info:
        post(f"{base}/v1/chat/completions", {"messages": []})
    assert info.value.code == 400


@pytest.mark.parametrize("body, message", [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be >= 1, got 0"),  # used to become 16
    ({"prompt": "hi", "max_tokens": 2.7}, "max_tokens must be an integer, got 2.7"),  # used to become 2
    ({"prompt": "hi", "max_tokens": "3"}, 'max_tokens must be an integer, got \\"3\\"'),
    ({"prompt": "hi", "max_completion_tokens": 0, "max_tokens": 4}, "max_completion_tokens must be >= 1"),
    ({"prompt": "hi", "max_tokens": 10**7}, "maximum context length is 131072 tokens: 1 prompt + 10000000"),
    ({"messages": [None]}, "messages[0] must be an object"),  # these three closed the connection unanswered
    ({"messages": ["hi"]}, "messages[0] must be an object"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": [1]},
     "stream_options must be an object"),
])
def test_malformed_requests_get_a_400_naming_the_field(endpoint, body, message):
    base, _ = endpoint
    route = "chat/completions" if "messages" in body else "completions"
    with pytest.raises(urllib.error.HTTPError) as info:
        post(f"{base}/v1/{route}", body)
    assert info.value.code == 400 and message in info.value.read().decode()


def test_every_stream_ends_with_its_finish_reason_under_a_burst_of_clients(endpoint):
    """48 streaming chats at once (socketserver's default backlog of 5 reset most of such a burst): each
    answers, its first chunk carries the assistant role and its last token chunk the finish reason (read
    just before the request ended, the token count could include the last token, which then went out
    without one, in about one stream in five)."""
    base, _ = endpoint
    results: list[list[dict]] = []

    def one(i: int) -> None:
        text = post(f"{base}/v1/chat/completions", {"max_tokens": 5 + i % 7, "stream": True,
                                                     "messages": [{"role": "user", "content": f"question {i}"}]})
        results.append([json.loads(line[6:]) for line in text.splitlines()
                        if line.startswith("data: ") and line != "data: [DONE]"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 48
    for chunks in results:
        reasons = [c["choices"][0]["finish_reason"] for c in chunks]
        assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("stream, n", [(True, 1), (False, 1), (True, 2), (False, 2)])
def test_a_client_that_disconnects_aborts_its_request(endpoint, stream, n):
    """As vLLM aborts a request whose client goes away: a 20,000-token completion (minutes of simulated
    decoding, seconds here) is dropped soon after its client closes the connection, with the reason, and its
    KV blocks are freed; a client that stays is unaffected."""
    import socket
    import time
    from urllib.parse import urlparse

    from twin.core.request import Status

    base, sim = endpoint
    port = urlparse(base).port
    body = json.dumps({"prompt": "a long answer please", "max_tokens": 20_000, "stream": stream, "n": n})
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    deadline = time.monotonic() + 10
    while len(sim.requests) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    if stream:
        assert conn.recv(64).startswith(b"HTTP/1.1 200")  # the stream has begun
    conn.close()
    assert len(sim.requests) == n
    for req in sim.requests:  # (with n = 2 both children)
        while not req.is_done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert req.status is Status.FAILED and req.fail_reason.startswith("the client disconnected")
        assert 0 <= req.num_output_tokens < 20_000
    assert not sim.sim.workers[0].sched.kv.req_blocks
    out = json.loads(post(f"{base}/v1/completions", {"prompt": "hi", "max_tokens": 3}))
    assert out["usage"]["completion_tokens"] == 3


def test_the_model_must_be_the_served_one_as_vllm_checks_it(endpoint):
    base, sim = endpoint
    assert sim.model_name == "meta-llama/Llama-3.1-8B"
    ok = json.loads(post(f"{base}/v1/completions", {"model": sim.model_name, "prompt": "hi", "max_tokens": 2}))
    assert ok["model"] == sim.model_name and ok["usage"]["completion_tokens"] == 2
    with pytest.raises(urllib.error.HTTPError) as info:  # used to be answered as if it were the served model
        post(f"{base}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
    error = json.loads(info.value.read())["error"]
    assert info.value.code == 404 and error == {"message": "The model `m` does not exist.", "type": "NotFoundError",
                                                "code": 404}
    assert len(sim.requests) == 1  # nothing was simulated for it


def test_a_served_model_name_replaces_the_models_own():
    httpd, sim = serve(load_config(None), port=0, time_scale=0.01, served_model_name="alias")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{httpd.server_port}"
        models = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=10).read())
        assert [m["id"] for m in models["data"]] == ["alias"]
        out = json.loads(post(f"{base}/v1/completions", {"model": "alias", "prompt": "hi", "max_tokens": 1}))
        assert out["model"] == "alias"
        with pytest.raises(urllib.error.HTTPError) as info:
            post(f"{base}/v1/completions", {"model": "meta-llama/Llama-3.1-8B", "prompt": "hi", "max_tokens": 1})
        assert info.value.code == 404
    finally:
        httpd.shutdown()
        httpd.server_close()
        sim.stop()


def test_n_completions_run_as_n_requests_sharing_the_prompt(endpoint):
    """vLLM's V1 parallel sampling: n requests with the prompt, whose later ones hit the prefix cache on the
    first one's prompt blocks (used to be answered with one choice, n ignored). A 100-token prompt of 16-token
    blocks: 6 full blocks = 96 cached tokens for each of the two later requests."""
    base, sim = endpoint
    out = json.loads(post(f"{base}/v1/completions", {"prompt": list(range(100)), "max_tokens": 5, "n": 3}))
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert all(c["text"] == " tok" * 5 and c["finish_reason"] == "length" for c in out["choices"])
    assert out["usage"] == {"prompt_tokens": 100, "completion_tokens": 15, "total_tokens": 115}
    reqs = sim.requests
    assert len(reqs) == 3 and len({tuple(r.block_keys) for r in reqs}) == 1
    assert [r.cached_tokens for r in reqs] == [0, 96, 96]


def test_n_streamed_chat_choices_each_end_with_their_finish_reason(endpoint):
    base, _ = endpoint
    text = post(f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": "two answers"}],
                                                 "max_tokens": 4, "n": 2, "stream": True,
                                                 "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    by_index: dict[int, list[dict]] = {0: [], 1: []}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        by_index[choice["index"]].append(choice)
    for choices in by_index.values():
        assert "".join(c["delta"]["content"] for c in choices) == " tok" * 4
        assert choices[0]["delta"]["role"] == "assistant" and all("role" not in c["delta"] for c in choices[1:])
        assert [c["finish_reason"] for c in choices] == [None, None, None, "length"]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8


@pytest.mark.parametrize("body, message", [
    ({"prompt": "hi", "n": 0}, "n must be an integer >= 1, got 0"),
    ({"prompt": "hi", "n": 1.5}, "n must be an integer >= 1, got 1.5"),
    ({"prompt": "hi", "n": True}, "n must be an integer >= 1, got true"),
    ({"prompt": "hi", "best_of": 2}, "best_of is not supported (vLLM's V1 engine accepts only 1), got 2"),
    ({"prompt": "hi", "logprobs": 1}, "logprobs not simulated"),
    ({"prompt": "hi", "echo": True, "logprobs": 0}, "logprobs, echo not simulated"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3},
     "logprobs, top_logprobs not simulated"),
])
def test_options_the_twin_cannot_answer_are_refused_by_name(endpoint, body, message):
    """Used to be dropped silently: a client asking for logprobs or echo got a reply without them."""
    assert_refused(endpoint, "chat/completions" if "messages" in body else "completions", body, message)


def test_defaults_of_refused_options_are_accepted(endpoint):
    """What benchmark clients send when they want none of them (vLLM's bench: best_of 1, logprobs null)."""
    base, _ = endpoint
    out = json.loads(post(f"{base}/v1/completions", {"prompt": "hi", "max_tokens": 2, "best_of": 1, "logprobs": None,
                                                      "echo": False, "n": 1}))
    assert len(out["choices"]) == 1
    chat = json.loads(post(f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 2, "logprobs": False, "top_logprobs": 0}))
    assert chat["choices"][0]["message"]["content"] == " tok" * 2


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 0.0, -1.0])
def test_a_time_scale_that_is_not_a_finite_positive_number_is_refused(scale, capsys):
    """Found by fuzzing: --time-scale inf was taken, and the simulation thread died at its first sleep (of NaN
    seconds, a traceback), every request then answered with a 500; it is now refused up front (exit 2)."""
    from twin.cli import main
    from twin.serve import SimulationServer

    with pytest.raises(ValueError, match=rf"^time_scale must be a finite number > 0, got {scale}$"):
        SimulationServer(load_config(None), time_scale=scale)
    assert main(["serve", "--port", "0", "--time-scale", str(scale)]) == 2
    assert capsys.readouterr().err == f"twin: error: time_scale must be a finite number > 0, got {scale}\n"


@pytest.mark.parametrize(("length", "message"), [
    ("99999999999", "bad request: the body ended after 2 of its 99999999999 bytes"),  # was a MemoryError
    ("-5", "bad request: Content-Length must be a whole number of bytes, got '-5'"),  # read until the client left
    ("2x", "bad request: Content-Length must be a whole number of bytes, got '2x'"),
])
def test_a_content_length_the_body_does_not_match_is_a_400(endpoint, length, message):
    """Found by fuzzing: the body was read in one call of Content-Length bytes, so 10**11 was an allocation of
    that size (a MemoryError traceback, no reply) and -5 read until the client closed; the client here sends
    two bytes and closes its side. Nothing is simulated for either."""
    import socket
    from urllib.parse import urlparse

    base, sim = endpoint
    conn = socket.create_connection(("127.0.0.1", urlparse(base).port))
    conn.settimeout(10)
    conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode())
    conn.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := conn.recv(4096):
        reply += chunk
    conn.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["error"]["message"] == message
    assert not sim.requests


@pytest.mark.parametrize("route, body, message", [
    ("completions", {"prompt": []}, "prompt must be non-empty: a string, a list of token ids or a list of one string "
                                    "or token list, got []"),  # was "one prompt per request"
    ("completions", {}, "missing field 'prompt' (required)"),  # was a bare "'prompt'"
    ("chat/completions", {}, "missing field 'messages' (required)"),
    ("completions", {"prompt": [[]]}, "prompt[0] must be a non-empty list of token ids, got []"),
    ("completions", {"prompt": [[1, True]]}, "prompt[0][1] must be a token id (an integer), got true"),
    ("completions", {"prompt": [[1], [2]]}, "one prompt per request"),
    ("completions", {"prompt": [1, "a"]}, 'prompt[1] must be a token id (an integer), got \\"a\\"'),
    ("completions", {"prompt": "hi", "stream": "no"}, 'stream must be a boolean (true or false), got \\"no\\"'),
    ("completions", {"prompt": "hi", "stream": 1}, "stream must be a boolean (true or false), got 1"),
    ("completions", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True,
                                                                        "continuous_usage_stats": 1}},
     "stream_options.continuous_usage_stats must be a boolean (true or false), got 1"),
    ("completions", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}},
     'stream_options.include_usage must be a boolean (true or false), got \\"yes\\"'),
    ("completions", {"prompt": "hi", "echo": "no"}, 'echo must be a boolean (true or false), got \\"no\\"'),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": "no"},
     'logprobs must be a boolean (true or false), got \\"no\\"'),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 5}]},
     "messages[1].content must be a string or a list of content parts, got 5"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text must be a string, got 5"),  # was "sequence item 0: expected str instance"
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, 7]}]},
     "messages[0].content[1] must be a content part (an object) or a string, got 7"),  # was dropped
    ("chat/completions", {"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role must be a string, got 3"),
])
def test_fields_of_the_wrong_type_are_a_400_naming_them(endpoint, route, body, message):
    """Found by fuzzing: "prompt": [] was answered "one prompt per request"; "stream": "no" was truthy and
    streamed; a message content of 5 was taken (as "5"), and a text part's text of 5 was a bare "sequence item
    0: expected str instance, int found". vLLM's request models refuse each with a 400; nothing is simulated."""
    assert_refused(endpoint, route, body, message)


def test_a_batch_of_one_token_list_is_that_prompt(endpoint):
    """vLLM takes "prompt": [[ids]] as a batch of one prompt; the twin refused it ("must be a string")."""
    base, _ = endpoint
    ids = [11, 12, 13, 14, 15]
    usage = [json.loads(post(f"{base}/v1/completions", {"prompt": p, "max_tokens": 2}))["usage"] for p in (ids, [ids])]
    assert usage[0] == usage[1] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_valid_booleans_and_contents_keep_their_meaning(endpoint):
    """null and false are not streamed; null content is no text; a plain string part is text, as vLLM's chat
    parser reads it (it was dropped), so the prompt counts it."""
    base, _ = endpoint
    for stream in (None, False):
        out = json.loads(post(f"{base}/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": stream,
                                                          "echo": None}))
        assert out["choices"][0]["text"] == " tok" * 2
    text = "Hello there, how are you?"
    chat = [{"role": "system", "content": None}, {"role": "user", "content": text}]
    parts = [{"role": "system", "content": None}, {"role": "user", "content": ["Hello there, ",
                                                                              {"type": "text", "text": "how are you?"}]}]
    usage = [json.loads(post(f"{base}/v1/chat/completions", {"messages": m, "max_tokens": 2}))["usage"]
             for m in (chat, parts)]
    assert usage[0] == usage[1]
    assert render_chat(parts) == render_chat(chat) == f"<|system|>\n<|user|>{text}\n<|assistant|>"


def test_a_speculative_steps_tokens_stream_as_one_chunk():
    """MTP with 3 drafts all accepted: the prompt's step streams token 1, each verify step 4 tokens in one
    chunk (vLLM streams one output per engine step), the last step the one token left of 10."""
    cfg = load_config(None, ["model.name=deepseek-ai/DeepSeek-R1", "hardware.gpu=h200_sxm", "system.tp=8",
                             "engine.speculative.method=mtp", "engine.speculative.num_speculative_tokens=3",
                             "engine.speculative.acceptance=1.0"])
    httpd, sim = serve(cfg, port=0, time_scale=0.01)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        text = post(f"http://127.0.0.1:{httpd.server_port}/v1/completions",
                    {"prompt": [1, 2, 3], "max_tokens": 10, "stream": True})
    finally:
        httpd.shutdown()
        httpd.server_close()
        sim.stop()
    chunks = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert [c["choices"][0]["text"] for c in chunks] == [" tok", " tok" * 4, " tok" * 4, " tok"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


# ------------------------------------------------------------------ FastAPI / uvicorn server (issue 52 item 7)
def start(config, **kwargs):
    """A server for ``config`` on a free port, serving on a thread: (base URL, simulation, stop)."""
    httpd, sim = serve(config, port=0, time_scale=0.01, **kwargs)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def stop():
        httpd.shutdown()
        httpd.server_close()
        sim.stop()

    return f"http://127.0.0.1:{httpd.server_port}", sim, stop


def test_the_official_openai_client_streams_chat_and_completions(endpoint):
    """openai's own client, pointed at the twin: chat and completions stream token by token (the first chat
    delta with the role, the last with the finish reason, the usage last), a whole reply and the model list
    read as from vLLM; a request over the context length is a BadRequestError of vLLM's type (it was an
    invalid_request_error)."""
    import openai

    base, sim = endpoint
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="twin", max_retries=0)
    chunks = list(client.chat.completions.create(
        model=sim.model_name, messages=[{"role": "user", "content": "Hello there"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert "".join(d.delta.content for d in deltas) == " tok" * 6 and deltas[0].delta.role == "assistant"
    assert [d.finish_reason for d in deltas][-1] == "length" and {d.finish_reason for d in deltas[:-1]} == {None}
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].model == sim.model_name
    texts = list(client.completions.create(model=sim.model_name, prompt=[1, 2, 3], max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in texts) == " tok" * 4 and texts[-1].choices[0].finish_reason == "length"
    whole = client.chat.completions.create(model=sim.model_name, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
    assert whole.choices[0].message.content == " tok" * 3 and whole.usage.completion_tokens == 3
    assert [m.id for m in client.models.list()] == [sim.model_name]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=sim.model_name, prompt=[1], max_tokens=200_000)
    assert info.value.status_code == 400 and info.value.type == "BadRequestError"
    assert "maximum context length is 131072 tokens" in info.value.message


def test_token_ids_outside_the_vocabulary_are_a_400_naming_them(endpoint):
    """Llama 3.1's vocabulary has 128,256 ids (vLLM refuses others: "Token id ... is out of vocabulary"); they
    were simulated as any other token. Its last id is one."""
    for prompt, message in (
            ([1, 2, 128256], "prompt[2] must be a token id in the model's vocabulary, 0 to 128255, got 128256"),
            ([[5, -1]], "prompt[0][1] must be a token id in the model's vocabulary, 0 to 128255, got -1")):
        assert_refused(endpoint, "completions", {"prompt": prompt}, message)
    base, _ = endpoint
    out = json.loads(post(f"{base}/v1/completions", {"prompt": [0, 128255], "max_tokens": 1}))
    assert out["usage"]["prompt_tokens"] == 2


def test_a_chat_role_openai_does_not_know_is_a_400(endpoint):
    """OpenAI's roles are system, developer, user, assistant, tool and function; "wizard" was rendered as a
    turn of its own."""
    assert_refused(endpoint, "chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]},
                   'messages[0].role must be one of system, developer, user, assistant, tool, function, '
                   'got \\"wizard\\"')
    base, _ = endpoint
    for role in ("developer", "tool", "function"):
        out = json.loads(post(f"{base}/v1/chat/completions", {"messages": [{"role": role, "content": "hi"}],
                                                               "max_tokens": 1}))
        assert out["usage"]["completion_tokens"] == 1


def histograms(text: str) -> dict[str, dict]:
    """``/metrics`` histograms: name -> {"type", "buckets": [(le, cumulative count)], "sum", "count"}."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE ") and line.endswith(" histogram"):
            out[line.split()[2]] = {"buckets": []}
        elif not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[: -len(suffix)]
                if name.endswith(suffix) and base in out:
                    if suffix == "_bucket":
                        out[base]["buckets"].append((series.split('le="', 1)[1].rstrip('"}'), int(value)))
                    else:
                        out[base][suffix[1:]] = float(value)
                    assert 'model_name="meta-llama/Llama-3.1-8B"' in series
    return out


VLLM_EDGES = {  # vllm/v1/metrics/buckets.py: PREFILL_LATENCY, TOKEN_STEP_LATENCY, ACCUMULATED_PHASE_LATENCY
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                         40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
}


def test_metrics_have_vllms_latency_histograms(endpoint):
    """/metrics had gauges and counters only: it now has vLLM's TTFT, inter-token and end-to-end histograms
    with vLLM's bucket edges, holding the simulated request's own latencies (simulated seconds)."""
    base, sim = endpoint
    post(f"{base}/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5})
    (req,) = sim.requests
    found = histograms(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode())
    assert sorted(found) == sorted(VLLM_EDGES)
    times = req.token_times_ns
    observed = {"vllm:time_to_first_token_seconds": [(req.first_token_ns - req.arrival_ns) / 1e9],
                "vllm:inter_token_latency_seconds": [(b - a) / 1e9 for a, b in zip(times, times[1:])],
                "vllm:e2e_request_latency_seconds": [(req.finish_ns - req.arrival_ns) / 1e9]}
    assert len(observed["vllm:inter_token_latency_seconds"]) == 4
    for name, edges in VLLM_EDGES.items():
        h, values = found[name], observed[name]
        assert [le for le, _ in h["buckets"]] == [*map(str, edges), "+Inf"]
        assert [n for _, n in h["buckets"]] == [sum(v <= e for v in values) for e in edges] + [len(values)]
        assert h["count"] == len(values) and h["sum"] == pytest.approx(sum(values), rel=1e-12)


def test_inter_token_latency_counts_one_gap_per_engine_step():
    """As vLLM V1 observes it: a speculative step's accepted drafts arrive together, one gap (3 gaps for the
    4 steps of test_a_speculative_steps_tokens_stream_as_one_chunk, not 9)."""
    base, sim, stop = start(load_config(None, [
        "model.name=deepseek-ai/DeepSeek-R1", "hardware.gpu=h200_sxm", "system.tp=8", "engine.speculative.method=mtp",
        "engine.speculative.num_speculative_tokens=3", "engine.speculative.acceptance=1.0"]))
    try:
        post(f"{base}/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 10})
        text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    finally:
        stop()
    count = next(line for line in text.splitlines() if line.startswith("vllm:inter_token_latency_seconds_count"))
    assert count.endswith(" 3")


def test_a_prompt_larger_than_the_kv_pool_is_a_bad_request_as_in_vllm():
    """A pool of 64 blocks of 16 tokens cannot hold a 2,000-token prompt: the request used to be simulated and
    failed (a 503); vLLM, whose context length never exceeds what its KV cache holds, answers a
    BadRequestError about the maximum context length. Nothing is simulated; a request that fits is served."""
    import openai

    base, sim, stop = start(load_config(None, ["kv_cache.num_blocks=64"]))
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="twin", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=sim.model_name, prompt=list(range(2000)), max_tokens=2)
        assert info.value.type == "BadRequestError" and info.value.body["code"] == 400
        assert info.value.body["message"] == (
            "This model's maximum context length is bounded by its KV cache (1024 tokens a worker): 2000 prompt + "
            "2 max_tokens can never be held (needs 126 KV blocks (2000 prompt + 2 output tokens) but worker 0 "
            "holds only 64)")
        assert not sim.requests
        fits = client.completions.create(model=sim.model_name, prompt=list(range(500)), max_tokens=2)
        assert fits.usage.total_tokens == 502
    finally:
        stop()


def test_the_default_max_tokens_is_documented_and_served(endpoint):
    """16 for completions (OpenAI's default), 256 for chat: in the request models' field descriptions, which
    the server's OpenAPI schema (/openapi.json, /docs) now publishes, in the README, and what a request
    without max_tokens gets."""
    from pathlib import Path

    base, _ = endpoint
    schema = json.loads(urllib.request.urlopen(f"{base}/openapi.json", timeout=10).read())
    for route, model, default in (("/v1/completions", "CompletionRequest", 16),
                                  ("/v1/chat/completions", "ChatCompletionRequest", 256)):
        body = schema["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        field = schema["components"]["schemas"][model]["properties"]["max_tokens"]
        assert field["description"].endswith(f"default {default}.")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "without one, 16 for completions and 256 for chat" in readme
    assert json.loads(post(f"{base}/v1/completions", {"prompt": "hi"}))["usage"]["completion_tokens"] == 16
    chat = json.loads(post(f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}))
    assert chat["usage"]["completion_tokens"] == 256


def test_a_port_in_use_is_an_error_naming_it(capsys):
    """It was "twin: error: [Errno 98] Address already in use", which names no port."""
    import socket

    from twin.cli import main

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        assert main(["serve", "--port", str(port)]) == 2
    finally:
        holder.close()
    assert capsys.readouterr().err == (f"twin: error: port {port} on 127.0.0.1 is in use (another server is "
                                       f"listening there): choose another with --port\n")


def test_without_the_serve_extra_twin_serve_says_what_to_install(monkeypatch, capsys):
    """FastAPI and uvicorn are the optional extra ``serve``: without them, the command says so (exit 2)."""
    import sys

    from twin.cli import main
    from twin.core.errors import TwinError

    monkeypatch.setitem(sys.modules, "fastapi", None)  # (an import of it fails)
    for name in ("twin.serve_app", "twin.serve_http"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(TwinError, match=r"pip install 'servetwin\[serve\]'$"):
        serve(load_config(None), port=0)
    assert main(["serve", "--port", "0"]) == 2
    assert capsys.readouterr().err == ("twin: error: twin serve needs FastAPI and uvicorn (fastapi is not "
                                       "installed): pip install 'servetwin[serve]'\n")
