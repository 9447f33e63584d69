"""A cloud's metadata service on 127.0.0.1 (http.server): AWS, GCP and Azure preemption notices, as documented.

``MetadataServer(cloud)`` serves the path that cloud uses — AWS ``/latest/meta-data/spot/instance-action``
(404 until a notice; IMDSv2's ``PUT /latest/api/token`` gives the token the read must carry), GCP
``/computeMetadata/v1/instance/preempted`` (``FALSE``/``TRUE``, only with ``Metadata-Flavor: Google``),
Azure ``/metadata/scheduledevents`` (``{"Events": [...]}``, only with ``Metadata: true``). ``announce()`` turns
the notice on; ``reads`` counts the reads that carried what the cloud requires.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATHS = {"AWS": "/latest/meta-data/spot/instance-action", "GCP": "/computeMetadata/v1/instance/preempted",
         "Azure": "/metadata/scheduledevents?api-version=2020-07-01"}
AWS_TOKEN = "imds-v2-token"


class MetadataServer:
    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        self.noticed = False
        self.reads = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_PUT(self) -> None:  # IMDSv2: the session token
                if self.path == "/latest/api/token" and server.cloud == "AWS":
                    self._reply(200, AWS_TOKEN)
                else:
                    self._reply(404, "")

            def do_GET(self) -> None:
                status, body = server.answer(self.path, self.headers)
                self._reply(status, body)

            def _reply(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{PATHS[cloud]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def announce(self) -> None:
        self.noticed = True

    def answer(self, path: str, headers) -> tuple[int, str]:
        if path != PATHS[self.cloud]:
            return 404, ""
        if self.cloud == "AWS":
            if headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
                return 401, ""
            self.reads += 1
            return (200, json.dumps({"action": "terminate", "time": "2026-11-26T12:05:41Z"})) if self.noticed else (404, "")
        if self.cloud == "GCP":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, ""
            self.reads += 1
            return 200, "TRUE" if self.noticed else "FALSE"
        if headers.get("Metadata") != "true":
            return 400, ""
        self.reads += 1
        events = [{"EventId": "1", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["vm1"],
                   "EventStatus": "Scheduled", "NotBefore": "Thu, 26 Nov 2026 12:05:41 GMT"}] if self.noticed else []
        return 200, json.dumps({"DocumentIncarnation": 1, "Events": events})

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptedServer:
    """A metadata service gone wrong, on 127.0.0.1 (raw sockets): each read gets the next of ``answers``, the last
    one for ever after. An answer is a body (sent whole, HTTP/1.0, status 200) or ``("trickle", where)``: a
    byte every 1.5 s of the headers (``where="headers"``) or of a long body (``"body"``) until the reader hangs up."""

    TRICKLE_S = 1.5

    def __init__(self, path: str, answers: list) -> None:
        import socket

        self.answers = list(answers)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}{path}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            threading.Thread(target=self._serve, args=(conn, answer), daemon=True).start()

    def _serve(self, conn, answer) -> None:
        import time

        try:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            if isinstance(answer, tuple):
                data = b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n"
                if answer[1] == "body":
                    conn.sendall(data)
                    data = b"[" * 100000
                for byte in data:
                    conn.sendall(bytes([byte]))
                    time.sleep(self.TRICKLE_S)
            else:
                body = answer.encode()
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._listener.close()
