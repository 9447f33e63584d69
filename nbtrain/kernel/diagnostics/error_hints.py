"""A hint under a rank's error where the error's own words lead away from the fix.

Two mistakes of code written for one GPU and pasted into a cell: ``.to("cuda")`` in a run without a GPU
(torch says it was not compiled with CUDA, or found no driver — true, but the fix is the run's ``device``), and
``.to(device)`` on a model built on the meta device (torch names ``to_empty()``, but not that
``nbtrain.prepare()`` gives the model storage and initialises it). The hints are read from the error's type and
message and the run's device type; they add a line under the traceback and change nothing else.
"""

from __future__ import annotations

from ...wire.protocol import RemoteError

# torch's words when a CUDA device is asked for where there is none (a CPU build, no driver, hidden GPUs), or
# when one was found beside the run's CPU tensors (--cpu on a machine with GPUs)
_NO_CUDA = ("torch not compiled with cuda enabled", "found no nvidia driver", "no cuda gpus are available",
            "cuda driver initialization failed", "invalid device ordinal", "found at least two devices, cuda")
# torch's words when a module or tensor on the meta device is moved with .to()
_META_MOVE = ("cannot copy out of meta tensor",)


def error_hints(error: RemoteError, device_type: str | None) -> list[str]:
    """The hints for ``error`` on a rank of a run on ``device_type`` (``"cpu"``, ``"cuda"``; None: not known)."""
    text = error.message.lower()
    hints = []
    if device_type == "cpu" and any(words in text for words in _NO_CUDA):
        hints.append("Hint: this run has no GPU (its ranks run on the CPU), so 'cuda' does not exist here. Use "
                     "`device`, which nbtrain sets to each rank's device: `.to(device)` in place of `.to('cuda')` "
                     "or `.cuda()`, and the cell runs on GPUs and CPUs alike.")
    if any(words in text for words in _META_MOVE):
        hints.append("Hint: the model was built on the meta device (it has no storage, so .to() has nothing to copy). "
                     "Give it to `nbtrain.prepare(model)`, which gives each rank storage on its device and runs each "
                     "module's reset_parameters() (or loads the checkpoint's weights), or call "
                     "`model.to_empty(device=device)` and initialise the weights yourself.")
    return hints
