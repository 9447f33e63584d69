"""The communication a DDP backward could not hide: from its last gradient to the end of its all-reduce.

DDP all-reduces each bucket of gradients as soon as the bucket is full, while backward goes on computing the
rest; what is left when backward has computed its *last* gradient — the last bucket's all-reduce, and any earlier
one still under way on a slow link or waiting for a slower rank — is time each step waits for the network. The
step split (:mod:`.stepsplit`) calls it *comm* and takes it out of *backward*.

**The marks.** A hook on the parameter whose gradient arrives last (``register_post_accumulate_grad_hook``) marks
the end of the computation. DDP waits for its all-reduces in a callback the autograd engine runs when backward
ends (queued when its last bucket is ready, which is after that hook); the hook queues a callback, and that
callback one more, so the second runs after DDP's wait: it marks the end of the communication. On a GPU both marks
are CUDA events on the current stream, which DDP's wait makes wait for the NCCL stream.

**Which parameter is last** is learned on the first backward (hooks on every trainable parameter, in the step the
step meter leaves out anyway), then only that parameter keeps a hook: one hook and two marks a step. A step whose
backward does not reach that parameter (an unused branch) has no mark: its communication stays in *backward*.
FSDP2's reduce-scatter has marks of its own (:mod:`.shard_meter`).
"""

from __future__ import annotations

import torch


def queue_at_backward_end(callback) -> None:
    """Run ``callback`` when the running backward ends, after the callbacks queued before it."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class LastGradient:
    """Tells ``split`` (a :class:`~.stepsplit.StepSplit`) when one DDP model's backward computed its last gradient
    and when its all-reduce was done (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, split) -> None:
        self._split = split
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._arrivals: list[int] = []  # the learning backward's parameters, in the order their gradients came
        self._handles = [p.register_post_accumulate_grad_hook(self._learning_hook(i))
                         for i, p in enumerate(self._params)]

    def _learning_hook(self, index: int):
        def arrived(_param) -> None:
            if not self._arrivals:
                queue_at_backward_end(self._learned)
            self._arrivals.append(index)
        return arrived

    def _learned(self) -> None:
        """The first backward ended: keep a hook on its last gradient's parameter alone."""
        for handle in self._handles:
            handle.remove()
        last = self._params[self._arrivals[-1]]
        self._handles = [last.register_post_accumulate_grad_hook(self._last_arrived)]

    def _last_arrived(self, _param) -> None:
        self._split.gradients_computed()
        queue_at_backward_end(lambda: queue_at_backward_end(self._split.gradients_reduced))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
