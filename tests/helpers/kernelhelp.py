"""A real Jupyter kernel (ipykernel, this interpreter) driven like a notebook front end."""

from __future__ import annotations

import contextlib
import os
import queue
import time
from collections.abc import Iterator

from jupyter_client.manager import start_new_kernel

from helpers import tiers
from helpers.outputs import output_text


class Kernel:
    def __init__(self, cwd: str | None = None, notebook: str | None = None) -> None:
        """A kernel started in ``cwd`` (default: this process's directory), as Jupyter starts one in the notebook's
        folder; with ``notebook``, the notebook's path given to it as Jupyter's server gives it."""
        tiers.starts("a Jupyter kernel")
        options: dict = {"cwd": cwd} if cwd else {}
        if notebook:
            options["env"] = {**os.environ, "JPY_SESSION_NAME": notebook}
        self.km, self.kc = start_new_kernel(kernel_name="python3", **options)

    def execute(self, code: str, timeout: float = 120.0) -> tuple[dict, str]:
        """Run ``code``; return the reply content and everything it printed."""
        msg_id = self.kc.execute(code)
        return self.collect(msg_id, timeout)

    def run(self, code: str, timeout: float = 120.0) -> str:
        """Run ``code``, which must succeed; return everything it printed."""
        reply, out = self.execute(code, timeout)
        assert reply["status"] == "ok", out
        return out

    def messages(self, timeout: float, poll: float | None = None) -> Iterator[dict | None]:
        """The kernel's iopub messages as they come, for ``timeout`` seconds at most; then TimeoutError.
        With ``poll``, None is yielded after each ``poll`` seconds without a message."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                yield self.kc.get_iopub_msg(timeout=max(0.05, min(left, poll) if poll else left))
            except queue.Empty:
                if poll is None or left <= 0:
                    raise TimeoutError(f"no further message within {timeout} s") from None
                yield None

    def collect(self, msg_id: str, timeout: float, until=None, poll: float | None = None) -> tuple[dict, str]:
        """What the cell ``msg_id`` shows until it is idle (then its reply) or until ``until(text so far)``
        (with ``poll``, ``until`` is also asked every ``poll`` seconds without a message)."""
        out: list[str] = []
        try:
            for msg in self.messages(timeout, poll):
                if msg is None:
                    if until is not None and until("".join(out)):
                        return {}, "".join(out)
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                out.append(output_text(kind, content))
                if until is not None and until("".join(out)):
                    return {}, "".join(out)
                if kind == "status" and content["execution_state"] == "idle":
                    return self._reply(msg_id)["content"], "".join(out)
        except TimeoutError:
            raise TimeoutError(f"no reply within {timeout} s; output so far: {''.join(out)[-2000:]}") from None

    def execute_answering(self, code: str, answers, timeout: float = 120.0) -> tuple[dict, str, list[str]]:
        """Run ``code`` with ``allow_stdin``, as a notebook does, typing ``answers`` (in order) into its input
        requests; an answer may be a callable of the prompt. Returns the reply, what it printed, the prompts."""
        msg_id = self.kc.execute(code, allow_stdin=True)
        answers, prompts = list(answers), []

        def answer_prompts(_printed: str) -> bool:  # called between iopub messages and while none comes
            while self.kc.stdin_channel.msg_ready():
                request = self.kc.get_stdin_msg(timeout=1)
                prompts.append(request["content"]["prompt"])
                if not answers:
                    raise AssertionError(f"unexpected prompt {prompts[-1]!r}; prompts so far: {prompts}")
                answer = answers.pop(0)
                self.kc.input(answer(prompts[-1]) if callable(answer) else answer)
            return False

        reply, out = self.collect(msg_id, timeout, until=answer_prompts, poll=0.05)
        return reply, out, prompts

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


@contextlib.contextmanager
def nbtrain_kernel() -> Iterator[Kernel]:
    """A kernel with ``%load_ext nbtrain`` run; on leaving, ``%distributed_shutdown`` ends its ranks, then the kernel."""
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbtrain")
        yield kernel
        kernel.execute("%distributed_shutdown")
    finally:
        kernel.shutdown()
