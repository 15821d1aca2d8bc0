"""A bucket that fails when told to: an HTTP proxy in front of fake-gcs-server.

Every client (google-cloud-storage, gcsfs, TensorStore) reaches the emulator through it,
so a fault is injected where a real one happens, on the wire: `fail(pattern, status)`
answers the requests that match with an HTTP error in Cloud Storage's JSON form (403
Forbidden, 503 Service Unavailable, ...), `times` times or until `clear()`; everything
else passes through unchanged. A request is matched by `"METHOD /path?query"` followed by
the first 4 kB of its body (an upload names its object in the query or in the body's
metadata part).
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import re
import socket
import threading
import urllib.parse

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}
_REASONS = {403: "Forbidden", 429: "Too Many Requests", 503: "Service Unavailable"}


@dataclasses.dataclass
class Rule:
  pattern: re.Pattern
  status: int
  times: int | None  # None: until cleared
  hits: int = 0


class FaultyGCS:
  """The proxy (`url`), forwarding to `upstream` (the emulator's URL)."""

  def __init__(self, upstream: str):
    self.upstream = upstream
    self._rules: list[Rule] = []
    self._lock = threading.Lock()
    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    self._server.daemon_threads = True
    self._server.proxy = self
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    threading.Thread(target=self._server.serve_forever, daemon=True,
                     name="faulty-gcs").start()

  def fail(self, pattern: str, status: int, times: int | None = None) -> Rule:
    """Answers requests matching `pattern` (a regex) with `status`."""
    rule = Rule(re.compile(pattern, re.S), status, times)
    with self._lock:
      self._rules.append(rule)
    return rule

  def clear(self) -> None:
    with self._lock:
      self._rules.clear()

  def _fault(self, request: str) -> int | None:
    with self._lock:
      for rule in self._rules:
        if (rule.times is None or rule.hits < rule.times) and rule.pattern.search(request):
          rule.hits += 1
          return rule.status
    return None

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
  """Forwards a request to the emulator, unless a rule of `server.proxy` answers it."""

  protocol_version = "HTTP/1.1"

  def log_message(self, *args) -> None:  # quiet
    pass

  def setup(self) -> None:
    super().setup()  # Headers and body go out in two writes: no Nagle delay between them.
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

  def handle(self) -> None:
    try:
      super().handle()
    except (BrokenPipeError, ConnectionResetError):  # The client hung up: so do we.
      pass

  def _body(self) -> bytes:
    if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
      out = b""
      while True:
        size = int(self.rfile.readline().strip().split(b";")[0], 16)
        if not size:
          self.rfile.readline()
          return out
        out += self.rfile.read(size)
        self.rfile.readline()
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _send(self, status: int, headers: list[tuple[str, str]], body: bytes,
            length: str | None = None) -> None:
    self.send_response(status, _REASONS.get(status))
    for k, v in headers:
      self.send_header(k, v)
    self.send_header("Content-Length", length or str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _any(self) -> None:
    proxy = self.server.proxy
    body = self._body()
    status = proxy._fault(f"{self.command} {self.path}\n" + body[:4096].decode("latin-1"))
    if status is not None:
      error = {"error": {"code": status, "message": f"injected {status}",
                         "errors": [{"message": f"injected {status}", "reason": "injected"}]}}
      self._send(status, [("Content-Type", "application/json")], json.dumps(error).encode())
      return
    up = urllib.parse.urlsplit(proxy.upstream)
    conn = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
    try:
      headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
      headers["Host"] = up.netloc
      conn.request(self.command, self.path, body=body, headers=headers)
      got = conn.getresponse()
      data = got.read().replace(proxy.upstream.encode(), proxy.url.encode())
      out = [(k, v.replace(proxy.upstream, proxy.url)) for k, v in got.getheaders()
             if k.lower() not in _HOP]
      self._send(got.status, out, data,
                 got.getheader("Content-Length") if self.command == "HEAD" else None)
    finally:
      conn.close()

  do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any
