"""Preemption notices on a node: SIGTERM to the agent, or the cloud's metadata service polled.

A machine about to be taken away says so in one of two ways, and the agent hears both:

* **SIGTERM** to the agent — a cloud's shutdown, Slurm's preemption (``--signal=B:TERM@60``, ``scancel``),
  Kubernetes deleting the pod (then SIGKILL after ``terminationGracePeriodSeconds``). The agent does not die
  of it: it tells the kernel, which has every rank save a checkpoint and then lets the node go. A second
  SIGTERM, or one while no ranks run, ends the agent at once.
* **the metadata service**, with ``--preemption-url URL`` (``NBTRAIN_PREEMPTION_URL``), read every
  :data:`POLL_S` seconds (only then; ``NBTRAIN_PREEMPTION_POLL_S`` changes it). The format is told by the
  URL's path, else by the answer:

  - AWS, ``http://169.254.169.254/latest/meta-data/spot/instance-action``: 404 until a notice, then JSON
    ``{"action": "terminate", "time": "2026-11-26T12:05:41Z"}`` (IMDSv2: a session token is asked for first
    with ``PUT /latest/api/token``; without one the request goes as IMDSv1);
  - GCP, ``http://metadata.google.internal/computeMetadata/v1/instance/preempted``: ``TRUE`` or ``FALSE``
    (header ``Metadata-Flavor: Google``);
  - Azure, ``http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01``: JSON ``{"Events":
    [{"EventType": "Preempt", "NotBefore": "Thu, 26 Nov 2026 12:05:41 GMT", …}]}`` (header ``Metadata: true``).

Each notice becomes a :class:`~nbtrain.wire.nodes.PreemptionNotice` on the kernel's link (typed, after the
link's authentication). What the metadata service answers is parsed as text or JSON, never unpickled.

Whatever the service answers, the poller goes on: each read has one deadline, :data:`READ_DEADLINE_S`, for the
connection, the headers and the body together (a reply trickled a byte at a time passes any per-read timeout,
not this), a reply over :data:`MAX_REPLY` bytes is not read, and an answer of the wrong shape (JSON that is not
an object, ``null``, events that are not objects, nesting too deep to parse) is no notice. The first such
failure is said once — on the agent's terminal and log, and in the cell (:func:`poll`'s ``say``) — and later
notices are still heard.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import threading
import time
import urllib.parse
from datetime import datetime
from email.utils import parsedate_to_datetime

from ..wire import nodes as N
from ..wire.agent_options import PreemptionURLError, check_url  # noqa: F401  (the agent's, declared with the option)

POLL_S = 5.0
READ_TIMEOUT_S = 2.0  # to connect
READ_DEADLINE_S = 3.0  # one read, whole: connection, headers and body, however slowly they come
MAX_REPLY = 1 << 16  # a notice is a few hundred bytes
_HEADERS = {"Metadata-Flavor": "Google", "Metadata": "true"}  # GCP's and Azure's; harmless to the others


def cloud_of(url: str, body: str = "") -> str:
    """``AWS``, ``GCP`` or ``Azure``: by the URL's path, else by what it answered."""
    path = urllib.parse.urlparse(url).path.lower()
    if "instance-action" in path:
        return "AWS"
    if "preempted" in path:
        return "GCP"
    if "scheduledevents" in path:
        return "Azure"
    text = body.strip()
    if text.upper() in ("TRUE", "FALSE"):
        return "GCP"
    return "Azure" if '"Events"' in text else "AWS"


def parse_notice(cloud: str, status: int, body: str, now: float) -> N.PreemptionNotice | None:
    """One answer of the metadata service: the notice it holds, or None; :class:`ValueError` for an answer that
    is not of the shape the cloud documents."""
    if status == 404 or status >= 400:
        return None  # AWS: no notice yet
    if cloud == "GCP":
        return N.PreemptionNotice("GCP", now) if body.strip().upper() == "TRUE" else None
    data = _json_object(body)
    if cloud == "Azure":
        events = data.get("Events", [])
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise ValueError("its Events are not a list of objects")
        events = [e for e in events if e.get("EventType") in ("Preempt", "Terminate")]
        if not events:
            return None
        return N.PreemptionNotice("Azure", now, _time(events[0].get("NotBefore")))
    if data.get("action") in ("terminate", "stop", "hibernate"):
        return N.PreemptionNotice("AWS", now, _time(data.get("time")))
    return None


def _json_object(body: str) -> dict:
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except RecursionError:
        raise ValueError("its JSON is nested too deep") from None
    if not isinstance(data, dict):
        raise ValueError(f"its JSON is {'null' if data is None else type(data).__name__}, not an object")
    return data


def _time(text) -> float | None:
    """ISO 8601 (AWS) or RFC 1123 (Azure) as unix time; None if absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(str(text)).timestamp()
    except (TypeError, ValueError):
        return None


def read_once(url: str) -> N.PreemptionNotice | None:
    """Ask the metadata service once, within :data:`READ_DEADLINE_S` (OSError when it cannot be reached or
    does not answer in time, ValueError when the answer is not a notice's shape)."""
    headers = dict(_HEADERS)
    token = _aws_token(url) if cloud_of(url) == "AWS" else None
    if token:
        headers["X-aws-ec2-metadata-token"] = token
    status, body = _request("GET", url, headers)
    return parse_notice(cloud_of(url, body), status, body, time.time())


def _aws_token(url: str) -> str | None:
    """IMDSv2's session token (``PUT /latest/api/token``); None where the service has none (IMDSv1)."""
    parsed = urllib.parse.urlsplit(url)
    try:
        status, body = _request("PUT", f"{parsed.scheme}://{parsed.netloc}/latest/api/token",
                                {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    except (OSError, ValueError):
        return None
    return (body.strip() or None) if status == 200 else None


def _request(method: str, url: str, headers: dict) -> tuple[int, str]:
    """One HTTP request, its status and body, bounded as a whole by :data:`READ_DEADLINE_S` and
    :data:`MAX_REPLY`: :class:`TimeoutError` past the deadline, :class:`ValueError` for a longer reply."""
    parsed = urllib.parse.urlsplit(url)
    kind = _WatchedHTTPS if parsed.scheme == "https" else _WatchedHTTP
    deadline = _Deadline(READ_DEADLINE_S)
    connection = kind(parsed.hostname or "", parsed.port, timeout=READ_TIMEOUT_S).bound(deadline)
    try:
        connection.request(method, (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else ""),
                           headers=headers)
        reply = connection.getresponse()
        body = reply.read(MAX_REPLY + 1)
    except (OSError, http.client.HTTPException) as exc:
        if deadline.passed:
            raise TimeoutError(f"no whole answer within {READ_DEADLINE_S:g} s") from None
        raise OSError(f"{type(exc).__name__}: {exc}") from None
    finally:
        deadline.cancel()
        connection.close()
    if deadline.passed:
        raise TimeoutError(f"no whole answer within {READ_DEADLINE_S:g} s")
    if len(body) > MAX_REPLY:
        raise ValueError(f"an answer over {MAX_REPLY // 1024} KiB")
    return reply.status, body.decode("utf-8", "replace")


class _Deadline:
    """One request's time, whole: at its end the sockets it watches are shut down, which ends any read or
    handshake blocked on them (a peer sending a byte now and then passes every per-read timeout, not this)."""

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._over = threading.Event()  # the request ended first
        threading.Thread(target=self._wait, args=(seconds,), name="nbtrain-node-read-deadline", daemon=True).start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.passed:
                _shut(sock)

    def cancel(self) -> None:
        self._over.set()

    def _wait(self, seconds: float) -> None:
        if self._over.wait(seconds):
            return
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTP(http.client.HTTPConnection):
    """An HTTP connection whose TCP socket a :class:`_Deadline` watches from the moment it exists."""

    _deadline: _Deadline

    def bound(self, deadline: _Deadline) -> _WatchedHTTP:
        self._deadline = deadline
        return self

    def connect(self) -> None:
        super().connect()  # http.client's: the TCP socket, self.sock
        self._deadline.watch(self.sock)


class _WatchedHTTPS(http.client.HTTPSConnection, _WatchedHTTP):
    """HTTPS: ``HTTPSConnection.connect`` calls the next ``connect`` in this order — :class:`_WatchedHTTP`'s — for
    the TCP socket, then does the TLS handshake on it, so the deadline covers the handshake too."""


class Notices:
    """The notices this agent heard, for its main loop to send (:meth:`take`), each source once."""

    def __init__(self) -> None:
        self._heard: list[N.PreemptionNotice] = []  # list.append is atomic: a signal handler may add to it
        self.sigterms = 0
        self._sent = False

    def on_sigterm(self, signum, frame) -> None:
        self.sigterms += 1
        self._heard.append(N.PreemptionNotice("SIGTERM", time.time()))

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.on_sigterm)

    def take(self) -> N.PreemptionNotice | None:
        """The first notice, once; later ones are the same event."""
        if self._sent or not self._heard:
            return None
        self._sent = True
        return self._heard[0]

    def poll(self, url: str, say, interval: float | None = None) -> threading.Thread:
        """Read ``url`` every ``interval`` seconds in a thread until it holds a notice."""
        every = interval if interval is not None else float(os.environ.get("NBTRAIN_PREEMPTION_POLL_S", POLL_S))

        def loop() -> None:
            complained = False
            while not self._heard:
                try:
                    notice = read_once(url)
                except Exception as exc:  # unreachable, too slow, or not a notice's shape: this thread must go on
                    if not complained:
                        say(f"cannot read the preemption notice URL {url} ({exc}); trying again every {every:g} s")
                        complained = True
                    notice = None
                if notice is not None:
                    self._heard.append(notice)
                    return
                time.sleep(every)

        thread = threading.Thread(target=loop, name="nbtrain-node-preemption", daemon=True)
        thread.start()
        return thread
