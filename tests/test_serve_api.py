"""``sinkwindow serve`` at the API level: requests fail alone, keys isolate sessions, every OpenAI
field is implemented or refused, and a session keeps what the client was shown.

All through the real ``openai`` client or raw HTTP against a server on 127.0.0.1 (a tiny random model).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("starlette", reason="pip install 'sinkwindow[serve]'")
pytest.importorskip("uvicorn", reason="pip install 'sinkwindow[serve]'")
openai = pytest.importorskip("openai", reason="the tests talk to the server through the openai client")

import sinkwindow  # noqa: E402
from sinkwindow.serve.app import build_app  # noqa: E402
from sinkwindow.serve.engine import Engine, Job  # noqa: E402
from sinkwindow.serve.protocol import FIELDS, NO_EFFECT, REFUSED  # noqa: E402
from sinkwindow.serve.sampling import Sampler, SamplingParams, adjust_reference  # noqa: E402
from sinkwindow.serve.sessions import SessionStore  # noqa: E402
from test_serve import CHUNK, SPEC, Server, _eos  # noqa: E402

KEYS = ["key-one", "key-two"]
# A ChatML-like template that opens every conversation with a default system prompt (w90 w91), as
# SmolLM2's does; roles are w80/w81/w82, a turn is "w3 ROLE content w4".
TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}w3 w80 w90 w91 w4 {% endif %}"
    "{% for m in messages %}w3 {% if m['role'] == 'system' %}w80{% elif m['role'] == 'user' %}w81"
    "{% else %}w82{% endif %} {{ m['content'] }} w4 {% endfor %}{% if add_generation_prompt %}w3 w82{% endif %}"
)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from conftest import make_tiny_folder

    folder = make_tiny_folder(tmp_path_factory.mktemp("serve_api"))
    model, tok = sinkwindow.load(str(folder), method=SPEC)
    tok.chat_template = TEMPLATE
    engine = Engine(model, max_active=4, max_queue=8, chunk_size=CHUNK, sessions=SessionStore(max_sessions=8))
    server = Server(build_app(engine, tok, ["tiny"], max_prompt_tokens=400, api_keys=KEYS))
    clients = [openai.OpenAI(base_url=f"{server.url}/v1", api_key=k, max_retries=0, timeout=60) for k in KEYS]
    yield server, model, tok, engine, clients
    server.stop()


def _http(
    port: int, method: str, path: str, body=None, key: str | None = KEYS[0], headers: dict | None = None
):
    """One raw HTTP request: the status and the JSON body (``None`` if not JSON)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    h.update(headers or {})
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, None


def _ids(response) -> list[int]:
    return response.model_extra["sinkwindow"]["token_ids"]


def _generate(model, ids: list[int], n: int) -> list[int]:
    out = sinkwindow.generate(model, torch.tensor([ids]), n, chunk_size=CHUNK, eos_token_id=_eos(model))
    return out[0, len(ids) :].tolist()


# --- 3. Requests fail alone ------------------------------------------------------------------


def test_a_bad_seed_is_a_400_and_the_next_request_is_answered(api):
    server, *_, (c, _) = api
    for seed in (2**64, -1, 1.5):
        with pytest.raises(openai.BadRequestError, match="seed must be an integer between 0 and") as err:
            c.completions.create(model="tiny", prompt="w2 w3", max_tokens=2, temperature=1.0, seed=seed)
        assert err.value.param == "seed"
    r = c.completions.create(model="tiny", prompt="w2 w3", max_tokens=2, temperature=1.0, seed=2**64 - 1)
    assert r.usage.completion_tokens == 2
    assert _http(server.port, "GET", "/health")[0] == 200


def test_a_request_that_fails_inside_the_engine_fails_alone(tmp_path):
    """A seed past manual_seed's range, or a failure while stepping, ends that request, not the worker."""
    from conftest import make_tiny_folder

    model, tok = sinkwindow.load(str(make_tiny_folder(tmp_path)), method=SPEC)
    engine = Engine(model, chunk_size=CHUNK).start()
    events: dict[str, list] = {}
    done = threading.Semaphore(0)

    def job(name, **kw):
        events[name] = []

        def emit(ev):
            events[name].append(ev)
            if ev[0] != "token":
                done.release()

        return Job(prompt=tok("w2 w3 w4").input_ids, max_new_tokens=4, emit=emit, **kw)

    def boom(token, info):
        raise RuntimeError("watch broke")

    try:
        engine.submit(job("seed", temperature=1.0, seed=2**64))
        engine.submit(job("watch", watch=boom))
        engine.submit(job("good"))
        for _ in range(3):
            assert done.acquire(timeout=60)
        assert events["seed"][-1][0] == "error" and "seed 18446744073709551616" in events["seed"][-1][1]
        assert events["watch"][-1][0] == "error" and "watch broke" in events["watch"][-1][1]
        assert events["good"][-1][:2] == ("done", "length")
        assert engine.alive(60.0)[0]
        engine.submit(job("after"))
        assert done.acquire(timeout=60) and events["after"][-1][:2] == ("done", "length")
    finally:
        engine.stop()
    assert engine.alive(60.0) == (False, "the engine's worker thread is not running")


def test_health_answers_503_once_the_worker_is_gone_or_stalled(tmp_path):
    from conftest import make_tiny_folder

    model, tok = sinkwindow.load(str(make_tiny_folder(tmp_path)), method=SPEC)
    engine = Engine(model, chunk_size=CHUNK)
    server = Server(build_app(engine, tok, ["tiny"]))
    try:
        assert _http(server.port, "GET", "/health", key=None)[0] == 200
        engine._queue.append(Job(prompt=[2], max_new_tokens=1))  # work waiting...
        engine.heartbeat -= 1000  # ...and no step for 1000 s
        status, body = _http(server.port, "GET", "/health", key=None)
        assert status == 503 and "has not stepped" in body["error"]["message"]
        engine._queue.clear()
        engine.stop()
        status, body = _http(server.port, "GET", "/health", key=None)
        assert status == 503 and body["status"] == "error" and "not running" in body["error"]["message"]
    finally:
        server.stop()


def _send_slowly(port: int, total: int, chunked: bool) -> tuple[int, float]:
    """POST ``total`` bytes of a JSON prompt in pieces; the status and the seconds it took."""
    piece = b"w5 " * 20_000
    head = b'{"model": "tiny", "max_tokens": 1, "prompt": "'
    t0 = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    length = b"Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}".encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer key-one\r\n" + length + b"\r\n\r\n")  # fmt: skip
    sent = 0
    try:
        for i in range(total // len(piece) + 1):
            data = head if i == 0 else piece
            sock.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            sent += len(data)
            time.sleep(0.01)
    except OSError:
        pass  # the server answered and closed before the end of the body
    status = int(sock.recv(4096).split(b" ")[1])
    sock.close()
    return status, time.monotonic() - t0


def test_a_huge_body_gets_413_and_health_stays_prompt_meanwhile(api):
    server, *_ = api
    for chunked in (False, True):
        with ThreadPoolExecutor(1) as pool:
            big = pool.submit(_send_slowly, server.port, 8 << 20, chunked)
            latencies = []
            while True:  # at least once, then until the upload is answered
                t0 = time.monotonic()
                assert _http(server.port, "GET", "/health")[0] == 200
                latencies.append(time.monotonic() - t0)
                if big.done():
                    break
                time.sleep(0.02)
            status, took = big.result()
        assert status == 413
        assert latencies and max(latencies) < max(0.5, took / 4), (max(latencies), took)


def test_a_long_prompt_is_refused_before_tokenizing_and_parsing_runs_off_the_loop(api):
    server, *_ = api
    # 900 KB of prompt (under the byte limit): refused by its characters, 16 per allowed token.
    body = {"model": "tiny", "prompt": "w5 " * 300_000, "max_tokens": 1}
    with ThreadPoolExecutor(4) as pool:
        bigs = [pool.submit(_http, server.port, "POST", "/v1/completions", body) for _ in range(3)]
        latencies = []
        while True:
            t0 = time.monotonic()
            assert _http(server.port, "GET", "/health")[0] == 200
            latencies.append(time.monotonic() - t0)
            if all(b.done() for b in bigs):
                break
    for b in bigs:
        status, reply = b.result()
        assert status == 400 and "more than 16 per token" in reply["error"]["message"]
    assert max(latencies) < 0.5


MALFORMED = [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"model": "tiny", "prompt": "\\ud800"}', "lone surrogate"),
    (b'{"model": "tiny", "prompt": "w2", "stop": ["\\udfff"]}', "lone surrogate"),
    (b'{"model": "tiny", "prompt": "w2", "x\\ud800": 1}', "lone surrogate"),
    (b"\xff\xfe", "not valid JSON"),
    (b'{"model": "tiny", "prompt": "", "session_id": "fresh"}', "gives no tokens"),
    (b'{"model": "tiny", "prompt": ""}', "gives no tokens"),
]
WRONG = {
    "prompt": [None, 5, [], [-1], [True], [10**30], [[1], [2]], {"a": 1}, [999]],
    "max_tokens": ["5", 1.5, -1, 10**40, True],
    "temperature": ["hot", -0.1, 2.5, float("nan"), 10**400, 1e-300],
    "top_p": [1.5, [], False],
    "seed": [2**64, -1, "1", 1e30],
    "stop": [5, ["a"] * 5, [1], "x" * 300],
    "stream": ["yes", 1],
    "stream_options": ["x", {"include_usage": "yes"}, {"other": True}],
    "presence_penalty": [3, -2.5, "x"],
    "frequency_penalty": [2.01, {}],
    "logit_bias": [[], {"a": 1}, {"-1": 1}, {"5": 101}, {"5": "x"}, {"100000": 1}],
    "logprobs": [True, 6, -1, "1"],
    "session_id": ["a/b", "", "x" * 65, 5, "é"],
    "user": [5],
    "metadata": ["x", {"a": 1}],
    "store": ["yes"],
    "model": [5, "", None],
}


def test_malformed_input_of_any_kind_is_a_400_never_a_500(api):
    server, *_ = api
    for raw, why in MALFORMED:
        status, body = _http(server.port, "POST", "/v1/completions", raw)
        assert status == 400 and why in body["error"]["message"], (raw[:60], body)
    for name, values in WRONG.items():
        for value in values:
            body = {"model": "tiny", "prompt": "w2 w3", "max_tokens": 1, name: value}
            status, reply = _http(server.port, "POST", "/v1/completions", body)
            assert status == 400 and reply["error"]["type"] == "invalid_request_error", (name, value, reply)
            assert name == "prompt" or reply["error"]["param"] == name, (name, value, reply)
    chat_wrong = [
        {"messages": "x"}, {"messages": []}, {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]}, {"messages": [{"role": "user", "content": "x", "name": "a"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "user", "content": "w2"}], "logprobs": 1},
        {"messages": [{"role": "user", "content": "w2"}], "top_logprobs": 2},
        {"messages": [{"role": "user", "content": "w2"}], "logprobs": True, "top_logprobs": 21},
        {"messages": [{"role": "user", "content": "w2"}], "prompt": "w2"},
    ]  # fmt: skip
    for extra in chat_wrong:
        status, reply = _http(server.port, "POST", "/v1/chat/completions", {"model": "tiny", **extra})
        assert status == 400, (extra, reply)
    assert (
        _http(server.port, "POST", "/v1/completions", {"model": "tiny", "prompt": "w2", "max_tokens": 1})[0]
        == 200
    )


# --- 4. Isolation ------------------------------------------------------------------------------


def test_a_second_key_cannot_see_continue_read_or_delete_the_first_keys_session(api):
    server, model, tok, engine, (one, two) = api
    r1 = one.completions.create(model="tiny", prompt="w2 w3 w4", max_tokens=2, temperature=0,
                                extra_body={"session_id": "mine"})  # fmt: skip
    assert r1.model_extra["sinkwindow"]["session"]["id"] == "mine"
    mine = lambda key: {s["id"] for s in _http(server.port, "GET", "/v1/sessions", key=key)[1]["data"]}  # noqa: E731
    assert "mine" in mine(KEYS[0]) and "mine" not in mine(KEYS[1])
    assert _http(server.port, "DELETE", "/v1/sessions/mine", key=KEYS[1])[0] == 404
    # The second key's "mine" is its own, new session: an empty prompt has nothing to continue.
    with pytest.raises(openai.BadRequestError, match="no session to continue"):
        two.completions.create(model="tiny", prompt="", max_tokens=2, extra_body={"session_id": "mine"})
    r2 = two.completions.create(model="tiny", prompt="w7", max_tokens=1, extra_body={"session_id": "mine"})
    assert r2.model_extra["sinkwindow"]["session"]["turns"] == 1
    # The first key's session went on untouched: its continuation equals generate on its own stream.
    r3 = one.completions.create(model="tiny", prompt="w5", max_tokens=2, temperature=0,
                                extra_body={"session_id": "mine"})  # fmt: skip
    stream = tok("w2 w3 w4").input_ids + _ids(r1) + tok("w5", add_special_tokens=False).input_ids
    assert _ids(r3) == _generate(model, stream, 2)
    assert _http(server.port, "DELETE", "/v1/sessions/mine", key=KEYS[0])[1]["deleted"] is True
    assert _http(server.port, "DELETE", "/v1/sessions/mine", key=KEYS[1])[1]["deleted"] is True
    assert "mine" not in mine(KEYS[0]) | mine(KEYS[1])


def test_a_missing_or_wrong_key_gets_401_on_every_route(api):
    server, *_ = api
    routes = [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v1/sessions"), ("DELETE", "/v1/sessions/x"),
              ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/nothing")]  # fmt: skip
    body = {"model": "tiny", "prompt": "w2", "max_tokens": 1}
    for method, path in routes:
        for key in (None, "wrong", KEYS[0] + "x", KEYS[0][:-1]):
            status, reply = _http(server.port, method, path, body if method == "POST" else None, key=key)
            assert status == 401 and reply["error"]["code"] == "invalid_api_key", (method, path, key)
        assert _http(server.port, method, path, body if method == "POST" else None, headers={
            "Authorization": f"Basic {KEYS[0]}"})[0] == 401  # fmt: skip
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_text_plain_bad_host_and_bad_session_ids_are_refused(api):
    server, *_, (c, _) = api
    body = json.dumps({"model": "tiny", "prompt": "w2", "max_tokens": 1}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        status, reply = _http(server.port, "POST", "/v1/completions", body, headers={"Content-Type": ctype})
        assert status == 415 and "application/json" in reply["error"]["message"]
    ok = _http(
        server.port,
        "POST",
        "/v1/completions",
        body,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok[0] == 200
    for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example", "10.0.0.1"):
        status, reply = _http(server.port, "GET", "/v1/models", headers={"Host": host})
        assert status == 421 and "Host" in reply["error"]["message"], host
    for host in (f"localhost:{server.port}", "127.0.0.5", f"[::1]:{server.port}"):
        assert _http(server.port, "GET", "/v1/models", headers={"Host": host})[0] == 200, host
    for sid in ("a/b", "../x", "a b", "x" * 65):
        with pytest.raises(openai.BadRequestError, match="session_id must be 1 to 64"):
            c.completions.create(model="tiny", prompt="w2", max_tokens=1, extra_body={"session_id": sid})
    assert _http(server.port, "DELETE", "/v1/sessions/a/b")[0] == 400
    assert _http(server.port, "DELETE", "/v1/sessions/a%20b")[0] == 400


def _args(folder, **kw) -> argparse.Namespace:
    base = dict(model=str(folder), method=SPEC, checkpoint=None, device="cpu", dtype="float32", threads=None,
                max_active=2, max_queue=4, chunk_size=CHUNK, max_sessions=4, kv_budget=None, kv_block_size=16,
                served_model_name=None,
                max_prompt_tokens=None, host="127.0.0.1", api_key=None, allow_unauthenticated=False,
                max_request_bytes=1 << 20)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_the_cli_refuses_an_open_bind_without_keys_and_a_kv_budget_below_one_session(
    tiny_folder, monkeypatch
):
    from sinkwindow.serve.cli import serve_app

    monkeypatch.delenv("SINKWINDOW_API_KEY", raising=False)
    with pytest.raises(ValueError, match="--allow-unauthenticated"):
        serve_app(_args(tiny_folder, host="0.0.0.0"))
    with pytest.raises(ValueError, match="below one session's KV cache"):
        serve_app(_args(tiny_folder, kv_budget=100))
    monkeypatch.setenv("SINKWINDOW_API_KEY", "a, b")
    app = serve_app(_args(tiny_folder, host="0.0.0.0", kv_budget=1 << 30))
    guard = next(m for m in app.user_middleware)
    assert len(guard.kwargs["keys"]) == 2 and guard.kwargs["loopback_only"] is False


# --- 5. Every parameter honoured or refused ---------------------------------------------------------

REFUSED_EXAMPLES = {
    "n": 2, "best_of": 2, "echo": True, "suffix": "w5", "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto", "functions": [{"name": "f"}], "function_call": "auto", "parallel_tool_calls": True,
    "response_format": {"type": "json_object"}, "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "w2"}, "web_search_options": {},
    "reasoning_effort": "low", "verbosity": "low", "moderation": {},
}  # fmt: skip
NO_EFFECT_EXAMPLES = {
    "user": "u1", "safety_identifier": "s1", "metadata": {"a": "b"}, "store": True, "service_tier": "auto",
    "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {},
}  # fmt: skip


def _schemas() -> dict[str, set[str]]:
    from openai.types import completion_create_params as completions
    from openai.types.chat import completion_create_params as chat

    out = {}
    for path, params in (("/v1/completions", completions), ("/v1/chat/completions", chat)):
        base = params.CompletionCreateParamsBase
        out[path] = set(base.__annotations__) | base.__required_keys__ | base.__optional_keys__
        out[path] |= set(params.CompletionCreateParamsStreaming.__annotations__)  # "stream"
    return out


def test_every_field_of_openais_current_schemas_is_implemented_or_refused(api):
    server, *_ = api
    schemas = _schemas()
    assert {"prompt", "logit_bias", "seed"} <= schemas["/v1/completions"] and "tools" in schemas[
        "/v1/chat/completions"
    ]
    for path, fields in schemas.items():
        base = {"model": "tiny", "max_tokens": 3, "temperature": 0}
        base |= (
            {"messages": [{"role": "user", "content": "w5 w6"}]} if "chat" in path else {"prompt": "w5 w6"}
        )
        plain = _http(server.port, "POST", path, base)[1]["sinkwindow"]["token_ids"]
        for name in sorted(fields):
            assert name in FIELDS, f"{name} ({path}) is in OpenAI's schema but not in protocol.FIELDS"
            status, reason = FIELDS[name]
            if status == REFUSED:
                got, reply = _http(server.port, "POST", path, {**base, name: REFUSED_EXAMPLES[name]})
                assert got == 400 and reply["error"]["param"] == name and name in reply["error"]["message"], (
                    name
                )
            elif status == NO_EFFECT:
                got, reply = _http(server.port, "POST", path, {**base, name: NO_EFFECT_EXAMPLES[name]})
                assert got == 200 and reply["sinkwindow"]["token_ids"] == plain, name
    got, reply = _http(server.port, "POST", "/v1/completions", {"model": "tiny", "prompt": "w2", "top_k": 5})
    assert got == 400 and reply["error"]["param"] == "top_k" and "unknown field" in reply["error"]["message"]
    assert _http(server.port, "POST", "/v1/completions", {"model": "tiny", "prompt": "w2", "max_tokens": 1,
                                                          "n": 1, "echo": False, "best_of": 1})[0] == 200  # fmt: skip


def test_the_vectorised_penalties_and_bias_equal_the_loop_reference():
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for _ in range(20):
        vocab = rng.randint(5, 40)
        params = SamplingParams(presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2),
                                logit_bias={rng.randrange(vocab): rng.uniform(-100, 100) for _ in range(3)})  # fmt: skip
        sampler, answer = Sampler(params), []
        for _ in range(rng.randint(1, 12)):
            logits = torch.randn(1, vocab, generator=gen)
            got = sampler.adjust(logits)[0].tolist()
            want = adjust_reference(logits[0].tolist(), answer, params)
            assert all(math.isclose(g, w, abs_tol=1e-4) for g, w in zip(got, want))
            token = rng.randrange(vocab) if rng.random() < 0.5 else (answer[-1] if answer else 0)
            sampler.observe(token)
            answer.append(token)


def test_penalties_and_logit_bias_change_greedy_answers_where_they_should(api):
    server, model, tok, _, (c, _) = api
    prompt = "w50 w60 w70"  # the tiny model answers w15 w15 w8 w18 w1 w15 w8 w1 w8 w60 w8 w1...

    def ask(**kw):
        return _ids(c.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, **kw))

    plain = ask()
    assert plain == _generate(model, tok(prompt).input_ids, 16)
    repeats = lambda ids: len(ids) - len(set(ids))  # noqa: E731
    assert repeats(plain) > 0  # the tiny model repeats itself: something to penalise
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalised = ask(**kw)
        assert penalised != plain and repeats(penalised) < repeats(plain), kw
        assert penalised[0] == plain[0]  # nothing generated yet: the first token is the same
    assert ask(presence_penalty=0.0, frequency_penalty=0.0) == plain
    assert ask(logit_bias={"42": 100}) == [42] * 16
    assert ask(logit_bias={str(plain[0]): -100})[0] != plain[0]


def test_completion_logprobs_are_the_models_and_zero_means_the_chosen_tokens_only(api):
    server, model, tok, _, (c, _) = api
    prompt = "w2 w3 w4"  # shorter than the window: a plain forward gives the same first logits
    r0 = c.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=0)
    lp = r0.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == r0.usage.completion_tokens == 4
    assert lp.top_logprobs == [{}] * 4 and lp.tokens == [tok.decode([t]) for t in _ids(r0)]
    with torch.no_grad():
        first = torch.log_softmax(model(torch.tensor([tok(prompt).input_ids])).logits[0, -1].float(), -1)
    assert math.isclose(lp.token_logprobs[0], float(first.max()), abs_tol=1e-4)
    text = r0.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and all(text[o:].lstrip().startswith(t) for o, t in
                                                            zip(lp.text_offset, lp.tokens))  # fmt: skip
    r3 = c.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=3)
    tops = r3.choices[0].logprobs.top_logprobs
    assert all(len(t) == 3 for t in tops) and r3.choices[0].logprobs.token_logprobs == lp.token_logprobs
    assert all(math.isclose(max(t.values()), v, abs_tol=1e-6) for t, v in zip(tops, lp.token_logprobs))
    streamed = c.completions.create(
        model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=3, stream=True
    )
    pieces = [ch.choices[0].logprobs for ch in streamed if ch.choices and ch.choices[0].logprobs]
    assert sum((p.token_logprobs for p in pieces), []) == lp.token_logprobs
    assert c.completions.create(model="tiny", prompt=prompt, max_tokens=2).choices[0].logprobs is None


def test_chat_logprobs_whole_and_streamed(api):
    server, model, tok, _, (c, _) = api
    msgs = [{"role": "user", "content": "w5 w6"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                  top_logprobs=2)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry, token in zip(content, _ids(r)):
        assert entry.token == tok.decode([token]) and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2 and math.isclose(
            entry.top_logprobs[0].logprob, entry.logprob, abs_tol=1e-6
        )
    chunks = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2, stream=True)  # fmt: skip
    streamed = [
        e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


# --- 6. Session semantics --------------------------------------------------------------------


def test_a_stop_string_and_what_follows_do_not_enter_the_session(api):
    server, model, tok, engine, (c, _) = api
    first, second = "w11 w12 w13 w14", "w20 w21"
    plain = _ids(c.completions.create(model="tiny", prompt=first, max_tokens=6, temperature=0))
    # A token whose text first appears in the answer at that token (a later stop would match earlier).
    k = next(i for i in range(1, 6) if tok.decode([plain[i]]) not in tok.decode(plain[:i]))
    stop = tok.decode([plain[k]])
    r1 = c.completions.create(model="tiny", prompt=first, max_tokens=6, temperature=0, stop=[stop],
                              extra_body={"session_id": "st"})  # fmt: skip
    assert r1.choices[0].finish_reason == "stop" and _ids(r1) == plain[: k + 1]
    assert r1.choices[0].text == tok.decode(plain[:k]) + " "  # shown: the answer up to the stop
    info = r1.model_extra["sinkwindow"]["session"]
    shown = tok(first).input_ids + plain[:k]
    assert info["tokens"] == len(shown)  # the stop's token is not kept (not even as pending)
    r2 = c.completions.create(
        model="tiny", prompt=second, max_tokens=4, temperature=0, extra_body={"session_id": "st"}
    )
    assert _ids(r2) == _generate(model, shown + tok(second, add_special_tokens=False).input_ids, 4)


def test_a_stop_string_begun_in_an_earlier_token_resets_the_session_rather_than_keep_it(api):
    server, model, tok, engine, (c, _) = api
    first = "w31 w32 w33"
    plain = _ids(c.completions.create(model="tiny", prompt=first, max_tokens=6, temperature=0))
    # A stop spanning two tokens (the first of them is fed before the stop is known), found first there.
    whole = tok.decode(plain)
    i = next(
        i for i in range(1, 4) if whole.find(tok.decode(plain[i : i + 2])) == len(tok.decode(plain[:i])) + 1
    )
    r = c.completions.create(model="tiny", prompt=first, max_tokens=6, temperature=0,
                             stop=tok.decode(plain[i : i + 2]), extra_body={"session_id": "st2"})  # fmt: skip
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == tok.decode(plain[:i]) + " "
    assert r.model_extra["sinkwindow"]["session"]["tokens"] == 0  # reset, and said so
    r2 = c.completions.create(model="tiny", prompt="w40 w41", max_tokens=3, temperature=0,
                              extra_body={"session_id": "st2"})  # fmt: skip
    assert _ids(r2) == _generate(model, tok("w40 w41").input_ids, 3)  # a fresh stream, with its BOS


def test_chat_turns_render_one_conversation_with_one_default_system_prompt(api):
    server, model, tok, engine, (c, _) = api
    turn1 = [{"role": "user", "content": "w10 w11"}]
    r1 = c.chat.completions.create(model="tiny", messages=turn1, max_tokens=3, temperature=0,
                                   extra_body={"session_id": "chat"})  # fmt: skip
    r2 = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w12"}], max_tokens=3,
                                   temperature=0, extra_body={"session_id": "chat"})  # fmt: skip
    whole = turn1 + [
        {"role": "assistant", "content": tok.decode(_ids(r1))},
        {"role": "user", "content": "w12"},
    ]
    rendered = tok.apply_chat_template(whole, tokenize=False, add_generation_prompt=True)
    stream = tok(rendered, add_special_tokens=False).input_ids
    assert stream.count(tok.convert_tokens_to_ids("w90")) == 1  # the default system prompt, once
    assert _ids(r2) == _generate(model, stream, 3)  # the session saw exactly that conversation


def test_a_stream_cut_off_by_the_engine_stopping_ends_with_an_error_and_done(tmp_path):
    from conftest import make_tiny_folder

    model, tok = sinkwindow.load(str(make_tiny_folder(tmp_path)), method=SPEC)
    engine = Engine(model, chunk_size=CHUNK)
    server = Server(build_app(engine, tok, ["tiny"]))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {
            "model": "tiny",
            "prompt": "w2 w3",
            "max_tokens": 1000,
            "temperature": 0,
            "stream": True,
            "logit_bias": {"2": -100},
        }  # no eos: it runs until cut off
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")
        with ThreadPoolExecutor(1) as pool:  # and a whole (not streamed) answer running beside it
            whole = pool.submit(
                _http, server.port, "POST", "/v1/completions", {**body, "stream": False}, None
            )
            deadline = time.monotonic() + 30
            while engine.stats()["active"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            engine.stop()
            status, reply = whole.result(60)
        assert status == 503 and reply["error"]["message"].startswith("the server stopped")
        lines = [line for line in r.read().decode().splitlines() if line]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2].removeprefix("data: "))["error"]["message"].startswith(
            "the server stopped"
        )
        conn.close()
    finally:
        server.stop()


def test_smollm2s_template_continues_without_its_default_system_prompt_again():
    """SmolLM2's template opens every conversation with its own system prompt: a continuation must not."""
    from conftest import smollm2_available

    if not smollm2_available():
        pytest.skip("SmolLM2 not installed")
    from transformers import AutoTokenizer

    from sinkwindow.models import loading as models
    from sinkwindow.serve.chat import render_continuation, render_first

    folder = models._converted_dir(models.resolve_gguf("smollm2-135m"))
    if not folder.exists():
        pytest.skip("SmolLM2 not converted yet (sinkwindow.load('smollm2-135m') converts it)")
    tok = AutoTokenizer.from_pretrained(folder)
    first, answer = [{"role": "user", "content": "Hi there"}], "Hello! How can I help?"
    later = [{"role": "user", "content": "And you?"}]
    whole = tok.apply_chat_template(first + [{"role": "assistant", "content": answer}] + later, tokenize=False,
                                    add_generation_prompt=True)  # fmt: skip
    assert whole.count("You are a helpful AI assistant") == 1
    # The answer ended on <|im_end|> (the pending token, already in the stream): its text is not sent again.
    stream = render_first(tok, first) + answer + "<|im_end|>" + render_continuation(tok, later, "<|im_end|>")
    assert stream == whole
    # An answer cut by max_tokens has no <|im_end|> yet: the continuation closes the turn itself.
    assert render_continuation(tok, later, None).startswith("<|im_end|>\n<|im_start|>user\n")
