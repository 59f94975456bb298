"""The client side of the serving benchmarks: start a server as a subprocess on 127.0.0.1 and talk to it.

Shared by ``serve_load.py`` (latency, throughput, sessions in a budget; ``sinkwindow serve`` and
``transformers serve`` side by side) and ``serve_soak.py`` (memory under hours of churn), and by
``tests/test_serve_soak.py``. Every address is the loopback one (:data:`HOST`: there is no way to
aim these at another machine), every HTTP call has a timeout, and every wait has a deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def call(
    port: int, method: str, path: str, body: dict | bytes | None = None, *, timeout: float = 60.0
) -> tuple[int, dict | None]:
    """One request and its whole answer: (status, JSON body or ``None`` when it is not JSON)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw or b"null")
        except ValueError:
            return r.status, None
    finally:
        conn.close()


def stream(
    port: int, body: dict, *, timeout: float, drop_after: int | None = None, path: str = "/v1/completions"
) -> dict:
    """One streamed completion, read to its end or dropped (the connection closed) after ``drop_after`` chunks.

    Returns the status, ``latency_s`` (request to last chunk), ``ttft_s`` (to the first chunk with
    text), ``tokens`` (the usage's completion tokens, else the chunks with text), ``dropped``,
    ``hung`` (no end within ``timeout`` seconds), ``error`` (a transport error's name, ``incomplete``
    for a stream cut before its finish reason or ``[DONE]``, or the error body's code) and ``sinkwindow`` (the server's extra on the last chunk, where it sends one).
    """
    out = {"status": None, "latency_s": None, "ttft_s": None, "tokens": 0, "dropped": False, "hung": False,
           "error": None, "sinkwindow": None}  # fmt: skip
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out["status"] = r.status
        if r.status != 200:
            err = json.loads(r.read() or b"null") or {}
            out["error"] = (err.get("error") or {}).get("code") if isinstance(err, dict) else None
            return out
        chunks, usage, done = 0, None, False
        for line in r:
            if time.perf_counter() - t0 > timeout:
                out["hung"] = True
                return out
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                done = done or line.startswith(b"data: ")
                continue
            chunk = json.loads(line[6:])
            # transformers serve sends no [DONE]: a finish reason ends the answer too.
            done = done or any(c.get("finish_reason") for c in chunk.get("choices") or [])
            usage = chunk.get("usage") or usage
            out["sinkwindow"] = chunk.get("sinkwindow") or out["sinkwindow"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                chunks += 1
                out["ttft_s"] = out["ttft_s"] or time.perf_counter() - t0
            if drop_after is not None and chunks >= drop_after:
                out["dropped"] = True
                return out
        out["tokens"] = usage["completion_tokens"] if usage else chunks
        if not done:  # the connection closed before the end of the stream: the server went away
            out["error"] = "incomplete"
            return out
        out["latency_s"] = time.perf_counter() - t0
        return out
    except TimeoutError:
        out["hung"] = True
        return out
    except (OSError, http.client.HTTPException) as err:
        out["error"] = type(err).__name__
        return out
    finally:
        conn.close()


def rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 once it has gone)."""
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


class Served:
    """A server started as a subprocess on a free port of 127.0.0.1, up once ``/health`` answers.

    Args:
        cmd: the command, without host and port (added here).
        threads: torch threads (``OMP_NUM_THREADS`` in its environment).
        log: where its stderr goes (default: nowhere).
        ready_s: seconds it gets to start.
    """

    def __init__(self, cmd: list[str], threads: int, log: Path | None = None, ready_s: float = 600.0):
        self.port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
        self.cmd = [*cmd, "--host", HOST, "--port", str(self.port)]
        self._log = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=self._log, env=env)
        deadline = time.monotonic() + ready_s
        while True:
            if self.proc.poll() is not None:
                self.close()
                raise SystemExit(f"the server exited with {self.proc.returncode}: {' '.join(self.cmd)}")
            try:
                if call(self.port, "GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the server did not start in {ready_s:.0f} s: {' '.join(self.cmd)}")
            time.sleep(0.5)

    @classmethod
    def sinkwindow(cls, model: str, method: str, threads: int, flags: list[str] = (), **kw) -> Served:
        cmd = [sys.executable, "-m", "sinkwindow.cli", "serve", "--model", model, "--method", method,
               "--threads", str(threads), *flags]  # fmt: skip
        return cls(cmd, threads, **kw)

    @classmethod
    def transformers(cls, folder: str, threads: int, flags: list[str] = (), **kw) -> Served:
        """``transformers serve`` on a local model folder, on the CPU, with continuous batching."""
        exe = Path(sys.executable).with_name("transformers")
        cmd = [str(exe), "serve", folder, "--device", "cpu", "--dtype", "float32", "--continuous-batching", "--log-level", "warning",
               *flags]  # fmt: skip
        return cls(cmd, threads, **kw)

    def rss(self) -> int:
        return rss(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self._log is not subprocess.DEVNULL:
            self._log.close()


class Held:
    """A streamed completion held open: it returns once the first token arrives (the server then
    holds the request's cache), and a thread reads the rest, so :attr:`alive` says whether the
    server is still generating it. ``status`` is not 200 on a refusal (``None``: no first token).
    """

    def __init__(self, port: int, body: dict, *, timeout: float, path: str = "/v1/completions"):
        self.status, self.ended, self._first = None, False, threading.Event()
        self._conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        self._thread = threading.Thread(target=self._read, args=(body, path), daemon=True)
        self._thread.start()
        self._first.wait(timeout)

    def _read(self, body: dict, path: str) -> None:
        try:
            self._conn.request("POST", path, body=json.dumps({**body, "stream": True}),
                               headers={"Content-Type": "application/json"})  # fmt: skip
            r = self._conn.getresponse()
            if r.status == 200:
                for line in r:
                    if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and chunk["choices"][0].get("text"):
                            self.status = 200
                            self._first.set()
            else:
                self.status = r.status
                r.read()
        except OSError:
            pass
        finally:
            self.ended = True
            self._first.set()

    @property
    def alive(self) -> bool:
        return self.status == 200 and not self.ended

    def close(self) -> None:
        self._conn.close()
        self._thread.join(5)
