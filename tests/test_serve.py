"""``sinkwindow serve`` answered by the real ``openai`` client, against a server started on 127.0.0.1.

Greedy answers must be token-identical to ``sinkwindow.generate`` on the same prompt alone, also
when several requests of different lengths run at once; bad input gets OpenAI's error body and the
server keeps serving; a session keeps its bounded cache between requests.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("starlette", reason="pip install 'sinkwindow[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="pip install 'sinkwindow[serve]'")
openai = pytest.importorskip("openai", reason="the tests talk to the server through the openai client")

import sinkwindow  # noqa: E402
from sinkwindow.serve.app import build_app  # noqa: E402
from sinkwindow.serve.engine import Engine, Job  # noqa: E402
from sinkwindow.serve.sessions import SessionStore  # noqa: E402
from sinkwindow.serve.text import IncrementalDecoder, StopMatcher  # noqa: E402

SPEC = "swa:8:2"
CHUNK = 5
BLOCK = 3  # pool blocks of 3 tokens: W = 8 spans three, the last one partly
POOL = 2**20  # bytes of KV pool (the default, a share of free RAM, is far more than tests need)


def _call(method: str, url: str, body: bytes | dict | list | None = None) -> tuple[int, dict]:
    """One HTTP request with the standard library (the status and the JSON body)."""
    host, _, path = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=120)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, "/" + path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = (r.status, json.loads(r.read() or b"null"))
    conn.close()
    return out


def _prompt(n: int, seed: int = 0) -> str:
    return " ".join(f"w{2 + (7 * i + 3 * seed) % 97}" for i in range(n))


class Server:
    """A uvicorn server in a thread, on a free port of 127.0.0.1."""

    def __init__(self, app):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=60)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from conftest import make_tiny_folder

    folder = make_tiny_folder(tmp_path_factory.mktemp("serve"))
    model, tok = sinkwindow.load(str(folder), method=SPEC)
    engine = Engine(model, max_active=4, max_queue=2, chunk_size=CHUNK, sessions=SessionStore(max_sessions=2),
                    block_size=BLOCK, kv_budget=POOL)  # fmt: skip
    server = Server(build_app(engine, tok, ["tiny"], max_prompt_tokens=400))
    yield server, model, tok, engine
    server.stop()


def _reference(model, tok, text: str, n: int, session_ids: list[int] | None = None) -> list[int]:
    """``sinkwindow.generate`` on the prompt alone: the tokens the server must give."""
    ids = session_ids if session_ids is not None else tok(text).input_ids
    out = sinkwindow.generate(model, torch.tensor([ids]), n, chunk_size=CHUNK, eos_token_id=_eos(model))
    return out[0, len(ids) :].tolist()


def _eos(model):
    """The stop token the server uses: the model's generation config's (as ``sinkwindow generate``)."""
    return model.generation_config.eos_token_id


def _ids(response) -> list[int]:
    return response.model_extra["sinkwindow"]["token_ids"]


def test_a_greedy_completion_equals_generate_on_that_prompt_alone(served):
    server, model, tok, _ = served
    text = _prompt(23)
    r = server.client.completions.create(model="tiny", prompt=text, max_tokens=12, temperature=0)
    want = _reference(model, tok, text, 12)
    assert _ids(r) == want
    assert r.choices[0].text == tok.decode(want, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(tok(text).input_ids) and r.usage.completion_tokens == len(want)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_streamed_text_is_the_whole_answer_in_pieces(served):
    server, model, tok, _ = served
    text = _prompt(17, seed=1)
    whole = server.client.completions.create(model="tiny", prompt=text, max_tokens=10, temperature=0)
    pieces, finish = [], None
    for chunk in server.client.completions.create(
        model="tiny", prompt=text, max_tokens=10, temperature=0, stream=True
    ):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == whole.choices[0].text and finish == whole.choices[0].finish_reason
    assert len([p for p in pieces if p]) > 1  # streamed, not sent at the end


def test_concurrent_requests_each_equal_their_one_at_a_time_answer(served):
    server, model, tok, _ = served
    prompts = [_prompt(n, seed=n) for n in (3, 11, 29, 47)]

    def ask(text):
        stream = server.client.completions.create(
            model="tiny", prompt=text, max_tokens=15, temperature=0, stream=True
        )
        chunks = list(stream)
        return chunks[-1].model_extra["sinkwindow"]["token_ids"]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(ask, prompts))
    for text, ids in zip(prompts, got):
        assert ids == _reference(model, tok, text, 15)
    assert served[3].peak_batch >= 2  # they did decode together, as rows of one forward


@pytest.mark.parametrize("spec", ["swa:8:2+full:1", "evict:8:2", "full", "swa:8:2:cache"])
def test_the_engine_without_a_decode_batch_or_with_a_dense_prompt_gives_generate_tokens(spec, tmp_path):
    """A hybrid and full attention decode each request alone; evict:W:S prefills its prompt dense; cache
    positions rotate the pool's keys per forward. Same tokens either way."""
    from conftest import make_tiny_folder

    model, tok = sinkwindow.load(str(make_tiny_folder(tmp_path)), method=spec)
    engine = Engine(model, chunk_size=CHUNK, kv_budget=POOL).start()
    assert engine.batched == (spec in ("evict:8:2", "swa:8:2:cache"))
    assert (engine.pool is not None) == (spec != "swa:8:2+full:1")  # full attention draws from the pool too
    try:
        jobs, out = [], {}
        done = threading.Semaphore(0)
        for n in (4, 13, 30):
            ids = tok(_prompt(n, seed=n)).input_ids
            out[n] = []
            emit = lambda ev, n=n: out[n].append(ev[1]) if ev[0] == "token" else done.release()  # noqa: E731
            jobs.append((n, ids))
            engine.submit(Job(prompt=ids, max_new_tokens=10, stop_ids=frozenset([_eos(model)]), emit=emit))
        for _ in jobs:
            assert done.acquire(timeout=120)
    finally:
        engine.stop()
    for n, ids in jobs:
        assert out[n] == _reference(model, tok, "", 10, session_ids=ids), n


def test_chat_uses_the_template_and_no_template_is_a_clear_400(served):
    server, model, tok, _ = served
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        server.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w5"}])
    tok.chat_template = "{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}w9"
    try:
        msgs = [{"role": "user", "content": _prompt(6)}]
        r = server.client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
        assert _ids(r) == _reference(model, tok, "", 6, session_ids=ids)
        assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
        chunks = list(server.client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                                            stream=True, stream_options={"include_usage": True}))  # fmt: skip
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == r.choices[0].message.content
        )
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    finally:
        tok.chat_template = None


def test_bad_input_gets_openai_errors_and_the_server_keeps_serving(served):
    server, *_ = served
    c = server.client
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        c.completions.create(model="gpt-4", prompt="w2", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be an integer"):
        c.completions.create(model="tiny", prompt="w2", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="more than this server's limit of 400") as err:
        c.completions.create(model="tiny", prompt=_prompt(401), max_tokens=2)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="pass the model's limit of 1024"):
        c.completions.create(model="tiny", prompt=_prompt(300), max_tokens=900)
    with pytest.raises(openai.BadRequestError, match="n is not supported"):
        c.completions.create(model="tiny", prompt="w2", max_tokens=2, n=2)
    status, body = _call("POST", f"{server.url}/v1/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = _call("POST", f"{server.url}/v1/completions", [1, 2])
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert _call("GET", f"{server.url}/v1/nothing")[0] == 404
    r = c.completions.create(model="tiny", prompt="w2 w3", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1
    assert [m.id for m in c.models.list().data] == ["tiny"]


def test_a_client_that_disconnects_mid_stream_frees_its_request(served):
    server, _, _, engine = served
    body = {"model": "tiny", "prompt": _prompt(5), "max_tokens": 900, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection(f"127.0.0.1:{server.port}", timeout=30)
    conn.request(
        "POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    conn.close()  # gone mid-stream
    deadline = time.monotonic() + 30
    while engine.stats()["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["active"] == 0 and engine.stats()["decode_batch"] == 0
    assert (
        server.client.completions.create(model="tiny", prompt="w2", max_tokens=1).usage.completion_tokens == 1
    )


def test_a_full_queue_answers_429_while_the_running_requests_finish(served):
    server, _, _, engine = served
    body = {"model": "tiny", "prompt": _prompt(5), "max_tokens": 600, "temperature": 0}
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_call, "POST", f"{server.url}/v1/completions", body) for _ in range(8)]
        codes = sorted(f.result()[0] for f in futures)
    # 4 run, 2 wait, the rest are refused (their arrival order decides which).
    assert codes.count(200) >= 6 and set(codes) <= {200, 429} and 429 in codes
    assert engine.stats()["active"] == 0


def test_a_session_continues_its_cache_and_stays_within_the_window(served):
    server, model, tok, engine = served
    c = server.client
    first, second = _prompt(13, seed=2), _prompt(9, seed=3)
    r1 = c.completions.create(
        model="tiny", prompt=first, max_tokens=5, temperature=0, extra_body={"session_id": "a"}
    )
    r2 = c.completions.create(
        model="tiny", prompt=second, max_tokens=5, temperature=0, extra_body={"session_id": "a"}
    )
    # One stream: first prompt, its answer, then the second prompt (no second BOS), then the answer.
    stream = tok(first).input_ids + _ids(r1) + tok(second, add_special_tokens=False).input_ids
    full = sinkwindow.generate(model, torch.tensor([stream]), 5, chunk_size=CHUNK, eos_token_id=_eos(model))
    assert _ids(r2) == full[0, len(stream) :].tolist()
    info = r2.model_extra["sinkwindow"]["session"]
    assert info["turns"] == 2 and info["tokens"] == len(stream) + len(_ids(r2)) - 1
    # Its memory is the pool blocks W tokens reach in every layer (ceil(8 / 3) = 3), whatever its length.
    session = engine.sessions._sessions["anonymous/a"]  # kept per API key (here none)
    assert [len(t) for t in session.kv_row.tables] == [3] * model.config.num_hidden_layers and engine.batched
    assert info["kv_cache_bytes"] == session.kv_row.blocks * engine.pool.block_bytes


def test_idle_sessions_beyond_the_limit_are_evicted_and_named(served):
    server, _, _, engine = served
    c = server.client
    for sid in ("x", "y", "z"):
        c.completions.create(model="tiny", prompt="w2 w3", max_tokens=1, extra_body={"session_id": sid})
    listing = _call("GET", f"{server.url}/v1/sessions")[1]
    assert len(listing["data"]) == 2 and "z" in {s["id"] for s in listing["data"]}
    assert any("--max-sessions 2" in e["reason"] for e in listing["evicted"])
    assert _call("DELETE", f"{server.url}/v1/sessions/z")[1]["deleted"] is True
    assert _call("DELETE", f"{server.url}/v1/sessions/z")[0] == 404


def test_health_reports_the_kv_pool_and_a_request_it_can_never_hold_gets_400(tmp_path):
    from conftest import make_tiny_folder

    model, tok = sinkwindow.load(str(make_tiny_folder(tmp_path)), method="full")
    layers = model.config.num_hidden_layers
    from sinkwindow.runtime.kv_pool import block_bytes as _block_bytes
    from sinkwindow.runtime.paged_cache import pool_shape

    shape = pool_shape(model)
    block_bytes = _block_bytes(shape["kv_heads"], shape["head_dim"], 4, shape["dtype"])
    engine = Engine(
        model, chunk_size=CHUNK, block_size=4, kv_budget=(8 * layers + 1) * block_bytes
    )  # 32 tokens
    server = Server(build_app(engine, tok, ["tiny"]))
    try:
        health = _call("GET", f"{server.url}/health")[1]
        assert health["kv_pool"] and health["pool_blocks"] == 8 * layers and health["pool_blocks_used"] == 0
        assert health["pool_bytes"] == 8 * layers * block_bytes and health["pool_block_tokens"] == 4
        with pytest.raises(openai.BadRequestError, match="more than the pool's") as err:
            server.client.completions.create(model="tiny", prompt=_prompt(30), max_tokens=5)
        assert err.value.code == "kv_pool_full"
        r = server.client.completions.create(model="tiny", prompt=_prompt(20), max_tokens=5, temperature=0)
        assert _ids(r) == _reference(model, tok, _prompt(20), 5)
        assert _call("GET", f"{server.url}/health")[1]["pool_blocks_used"] == 0
    finally:
        server.stop()


def test_incremental_text_and_stop_strings():
    class Tok:  # bytes split over tokens: decode must not emit half a character
        table = {1: b"a", 2: "é".encode()[:1], 3: "é".encode()[1:], 4: b" b"}

        def decode(self, ids, skip_special_tokens=True):
            return b"".join(self.table[i] for i in ids).decode(errors="replace")

    d = IncrementalDecoder(Tok())
    assert [d.push(t) for t in (1, 2, 3, 4)] == ["a", "", "é", " b"]
    s = StopMatcher(["END"])
    assert s.feed("abc E") == ("abc ", False) and s.feed("N") == ("", False) and s.feed("Dx") == ("", True)
    s = StopMatcher(["END"])
    assert s.feed("abc E") == ("abc ", False) and s.feed("x") == ("Ex", False) and s.flush() == ""


def test_serve_answers_sigterm_by_exiting_cleanly(tiny_folder):
    import signal
    import subprocess
    import sys

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sinkwindow.cli", "serve", "--model", str(tiny_folder), "--method", SPEC,
         "--port", str(port), "--threads", "1", "--kv-budget", "1MiB"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if _call("GET", f"http://127.0.0.1:{port}/health")[1]["status"] == "ok":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # A request in flight when SIGTERM comes is finished, not dropped; then the process ends.
        body = {"model": str(tiny_folder), "prompt": "w2 w3", "max_tokens": 400, "temperature": 0}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(_call, "POST", f"http://127.0.0.1:{port}/v1/completions", body)
            while _call("GET", f"http://127.0.0.1:{port}/health")[1]["active"] == 0 and not answer.done():
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            status, reply = answer.result(60)
        assert status == 200 and reply["choices"][0]["finish_reason"] in ("length", "stop"), reply
        # uvicorn re-raises the signal after its graceful shutdown, so the exit status says SIGTERM.
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_smollm2_answers_the_openai_client_streamed(tmp_path):
    from conftest import smollm2_available

    if not smollm2_available():
        pytest.skip("SmolLM2 not installed")
    args = argparse.Namespace(
        model="smollm2-135m", method="swa:1024:4", checkpoint=None, device="cpu", dtype="float32", threads=None,
        host="127.0.0.1", api_key=None, allow_unauthenticated=False, max_request_bytes=1 << 20,
        max_active=2, max_queue=4, chunk_size=512, max_sessions=4, kv_budget=128 * 2**20, kv_block_size=16,
        served_model_name=None,
        max_prompt_tokens=None,
    )  # fmt: skip
    from sinkwindow.serve.cli import serve_app

    server = Server(serve_app(args))
    try:
        msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        chunks = list(server.client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=8,
                                                            temperature=0, stream=True))  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "Paris" in text, json.dumps(text)
        whole = server.client.chat.completions.create(
            model="smollm2-135m", messages=msgs, max_tokens=8, temperature=0
        )
        assert whole.choices[0].message.content == text  # streamed and not: the same answer
        r = server.client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=4,
                                             temperature=0)  # fmt: skip
        assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
    finally:
        server.stop()
