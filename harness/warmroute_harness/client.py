"""HTTP to the fleet's servers on 127.0.0.1: readiness, one-shot GET/POST, OpenAI request bodies.

Every call opens its own connection and reads the whole reply, so a test sees exactly one
request per call, and a POST sets TCP_NODELAY so small bodies are not held back by Nagle.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from dataclasses import dataclass

MODEL = "sim-llama-8b"


# Ports free_port() handed out in this process. A port is only reserved once its server
# binds it, and a fleet asks for all its ports first (sims, then Envoy's listener and
# admin), so the kernel's random pick could return one port twice: a sim and Envoy's admin
# port on one number, and the sim's 404 to /ready read as Envoy ready (about
# 1/28000 per pair of ports, several hundred pairs in `make test`: 1-2% of runs).
_handed_out: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now, never one this process handed out before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_http(port: int, path: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    """Waits until 127.0.0.1:port answers `path` below 500; fails early if `proc` exits."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before 127.0.0.1:{port}{path} answered")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            if r.status < 500:
                return
            last = r.status
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"127.0.0.1:{port}{path} not ready: {last}")


def get(port: int, path: str, timeout: float = 5) -> bytes:
    """The body of GET 127.0.0.1:port/path (admin pages, /metrics)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    body = c.getresponse().read()
    c.close()
    return body


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replica(self) -> str | None:
        """The sim replica that served the request (the sim's own response header)."""
        return self.headers.get("x-sim-replica")

    def json(self):
        return json.loads(self.body)


def post(port: int, path: str, body, headers: dict[str, str] | None = None, timeout: float = 60) -> Reply:
    """One request over a fresh connection (TCP_NODELAY), whole body read."""
    data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    h = {"content-type": "application/json", **(headers or {})}
    c.request("POST", path, body=data, headers=h)
    r = c.getresponse()
    out = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    c.close()
    return out


def chat(model: str, messages: list[dict], **extra) -> dict:
    """A chat-completions body; 4 output tokens unless `max_tokens` says otherwise."""
    return {"model": model, "messages": messages, "max_tokens": extra.pop("max_tokens", 4), **extra}


def words(tag: str, n: int) -> str:
    """n deterministic words (the sim counts one word as one token)."""
    return " ".join(f"{tag}{i}" for i in range(n))
