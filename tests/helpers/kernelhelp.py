"""A real Jupyter kernel (ipykernel, this interpreter) driven like a notebook front end."""

from __future__ import annotations

import queue
import time

from jupyter_client.manager import start_new_kernel


class Kernel:
    def __init__(self, cwd: str | None = None) -> None:
        """A kernel started in ``cwd`` (default: this process's directory), as Jupyter starts one in the notebook's folder."""
        self.km, self.kc = start_new_kernel(kernel_name="python3", **({"cwd": cwd} if cwd else {}))

    def execute(self, code: str, timeout: float = 120.0) -> tuple[dict, str]:
        """Run ``code``; return the reply content and everything it printed."""
        msg_id = self.kc.execute(code)
        return self.collect(msg_id, timeout)

    def collect(self, msg_id: str, timeout: float, until=None) -> tuple[dict, str]:
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no reply within {timeout} s; output so far: {''.join(out)[-2000:]}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                out.append("\n".join(content["traceback"]))
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", ""))
            if until is not None and until("".join(out)):
                return {}, "".join(out)
            if kind == "status" and content["execution_state"] == "idle":
                return self._reply(msg_id)["content"], "".join(out)

    def _reply(self, msg_id: str) -> dict:
        """The shell reply to ``msg_id``; an earlier one still queued (a kernel_info reply) is skipped."""
        while True:
            reply = self.kc.get_shell_msg(timeout=10)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def start(self, code: str) -> str:
        return self.kc.execute(code)

    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
