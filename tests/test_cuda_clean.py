"""The kernel never touches CUDA on nbtrain's behalf — checked on a machine without a GPU too.

``torch.cuda.is_initialized()`` is always False where there is no GPU, so asserting it proves nothing here.
Instead every entry into CUDA that the kernel could make — torch's lazy initialisation and the driver calls
that count or probe devices (each initialises the driver in this process, after which a fork of it cannot use
CUDA) — is replaced by a recorder for the length of a real ``%%distributed`` cell with its dashboard; the
test fails if nbtrain called any of them. A call made on purpose afterwards shows the recorder sees them.
"""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

pytestmark = pytest.mark.slow  # a real cell: ranks, the dashboard's telemetry

ENTRIES = ((torch.cuda, "_lazy_init"), (torch.cuda, "init"), (torch.cuda, "is_available"),
           (torch.cuda, "device_count"), (torch._C, "_cuda_init"), (torch._C, "_cuda_getDeviceCount"))


@pytest.fixture
def cuda_calls(monkeypatch):
    """The names of the CUDA entries called while the test runs (each still does what it did)."""
    calls: list[str] = []
    for owner, name in ENTRIES:
        real = getattr(owner, name, None)
        if real is None:
            continue

        def recorded(*args, _real=real, _name=f"{owner.__name__}.{name}", **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)
    return calls


def test_kernel_never_initialises_cuda(cuda_calls):
    """A cell with its dashboard makes no CUDA call in the kernel."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtrain")
    try:
        result = shell.run_cell("%%distributed 2 --cpu\nimport nbtrain\nfor step in range(3):\n"
                                "    nbtrain.log(loss=1.0 / (step + 1))\nx = rank\n")
        assert result.success, result.error_in_exec
        assert shell.user_ns["x"] == 0
        assert cuda_calls == [], f"the kernel called into CUDA: {cuda_calls}"
    finally:
        shell.run_line_magic("distributed_shutdown", "")
    torch.cuda.device_count()  # what the recorder would have seen
    assert cuda_calls and cuda_calls[0] == "torch.cuda.device_count"
