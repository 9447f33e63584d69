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
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from email.utils import parsedate_to_datetime

from ..wire import nodes as N
from ..wire.agent_options import PreemptionURLError, check_url  # noqa: F401  (the agent's, declared with the option)

POLL_S = 5.0
READ_TIMEOUT_S = 2.0
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
    """One answer of the metadata service: the notice it holds, or None."""
    if status == 404 or status >= 400:
        return None  # AWS: no notice yet
    if cloud == "GCP":
        return N.PreemptionNotice("GCP", now) if body.strip().upper() == "TRUE" else None
    data = json.loads(body) if body.strip() else {}
    if cloud == "Azure":
        events = [e for e in data.get("Events", []) if e.get("EventType") in ("Preempt", "Terminate")]
        if not events:
            return None
        return N.PreemptionNotice("Azure", now, _time(events[0].get("NotBefore")))
    if data.get("action") in ("terminate", "stop", "hibernate"):
        return N.PreemptionNotice("AWS", now, _time(data.get("time")))
    return None


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
    """Ask the metadata service once (raises OSError when it cannot be reached)."""
    headers = dict(_HEADERS)
    token = _aws_token(url) if cloud_of(url) == "AWS" else None
    if token:
        headers["X-aws-ec2-metadata-token"] = token
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=READ_TIMEOUT_S) as reply:
            status, body = reply.status, reply.read(1 << 16).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, ""
    return parse_notice(cloud_of(url, body), status, body, time.time())


def _aws_token(url: str) -> str | None:
    """IMDSv2's session token (``PUT /latest/api/token``); None where the service has none (IMDSv1)."""
    parsed = urllib.parse.urlparse(url)
    request = urllib.request.Request(f"{parsed.scheme}://{parsed.netloc}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    try:
        with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as reply:
            return reply.read(4096).decode().strip() or None
    except (OSError, ValueError):
        return None


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
                except (OSError, ValueError) as exc:  # unreachable, or not the JSON expected: said once
                    if not complained:
                        say(f"cannot read the preemption notice URL {url} ({exc}); trying every {every:.0f} s")
                        complained = True
                    notice = None
                if notice is not None:
                    self._heard.append(notice)
                    return
                time.sleep(every)

        thread = threading.Thread(target=loop, name="nbtrain-node-preemption", daemon=True)
        thread.start()
        return thread
