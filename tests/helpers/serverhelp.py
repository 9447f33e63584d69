"""Driving a kernel that a (test) Jupyter server started, from the test's own event loop."""

from __future__ import annotations

import asyncio
import json
import time

from jupyter_client.asynchronous import AsyncKernelClient

from helpers.outputs import output_text

ENDLESS_RUN = """%%distributed 2 --cpu
import time
import nbtrain
step = 0
while True:
    nbtrain.log(loss=1.0 / (step + 1), step=step)
    step += 1
    time.sleep(0.05)
"""


class ServerKernel:
    """An execute/collect client for one kernel of the server's kernel manager."""

    def __init__(self, kernel_manager, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self.client = AsyncKernelClient()
        self.client.load_connection_info(kernel_manager.get_kernel(kernel_id).get_connection_info())
        # A client the kernel manager did not make judges the kernel alive by its heartbeat, by default
        # one missed second: on a loaded machine that reads a starting kernel as dead.
        self.client.hb_channel.time_to_dead = 10.0
        self.client.start_channels()

    async def ready(self, timeout: float = 60) -> None:
        await self.client.wait_for_ready(timeout=timeout)

    def start(self, code: str) -> str:
        return self.client.execute(code)

    async def finish(self, msg_id: str, timeout: float = 120) -> tuple[dict, str]:
        """Wait for the reply to ``msg_id``; return it with everything the cell showed, as text (tracebacks too)."""
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the cell did not finish in {timeout} s; output: {''.join(out)[-2000:]}")
            try:
                msg = await self.client.get_iopub_msg(timeout=min(remaining, 1.0))
            except Exception:  # queue.Empty: nothing yet
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            out.append(output_text(kind, content))
            if kind == "status" and content["execution_state"] == "idle":
                while True:
                    reply = await self.client.get_shell_msg(timeout=10)
                    if reply["parent_header"].get("msg_id") == msg_id:
                        return reply["content"], "".join(out)

    async def run(self, code: str, timeout: float = 120) -> tuple[dict, str]:
        return await self.finish(self.start(code), timeout)

    def close(self) -> None:
        self.client.stop_channels()


async def fetch_json(jp_fetch, *parts, **kwargs):
    response = await jp_fetch(*parts, **kwargs)
    return response.code, json.loads(response.body)


async def open_notebook_kernel(jp_fetch, jp_serverapp, path: str) -> tuple[str, ServerKernel]:
    """Open a session for the notebook ``path`` as the front end does (POST /api/sessions, a python3 kernel);
    returns its kernel id and a client for the kernel."""
    name = path.rsplit("/", 1)[-1]
    _, session = await fetch_json(jp_fetch, "api", "sessions", method="POST", body=json.dumps(
        {"path": path, "name": name, "type": "notebook", "kernel": {"name": "python3"}}))
    kernel_id = session["kernel"]["id"]
    return kernel_id, ServerKernel(jp_serverapp.kernel_manager, kernel_id)


async def wait_for(probe, what: str, timeout: float = 60, interval: float = 0.25):
    """Await ``probe()`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
