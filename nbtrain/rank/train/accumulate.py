"""Gradient accumulation (``--grad-accum K``): K micro-steps, one optimizer step, one all-reduce.

Each ``nbtrain.backward(loss)`` is a micro-step; it back-propagates ``loss / K``, so K micro-batches of
size b add up to the gradient of one batch of size K·b (losses that are means over the batch). The
prepared optimizer's ``step()`` and ``zero_grad()`` act only when a window of K micro-steps is complete;
on the other calls they do nothing, so the training loop stays the ordinary one.

DDP all-reduces gradients during backward. On the first K-1 micro-steps that would be wasted, so the
prepared model turns synchronisation off for them — what ``DistributedDataParallel.no_sync()`` does —
deciding in its forward (DDP reads the flag there) whether the coming backward completes the window.

The last batch of a prepared DataLoader always completes a window, so no gradient is carried into the
next epoch (the last window may then be shorter than K; its loss is still divided by K, as in 🤗 Accelerate).

:class:`Accumulation` is the window's bookkeeping; the calls a cell makes (``nbtrain.backward``,
``nbtrain.clip_grad_norm_``) are in :mod:`nbtrain.rank.train.steps`.
"""

from __future__ import annotations


class Accumulation:
    def __init__(self, k: int) -> None:
        self.k = k
        self.micro = 0  # backward() calls in the current window
        self.closing = False  # the window's optimizer step was taken; the next backward opens a new one
        self.backward_used = False
        self.active_loaders: list = []  # prepared loaders being iterated, innermost last

    def resize(self, k: int) -> None:
        """A window of ``k`` micro-steps from the one that opens now (``--ft keep-batch``: as many as keep the
        global batch with the groups of this step's quorum)."""
        self.k = k

    @property
    def end_of_loader(self) -> bool:
        return bool(self.active_loaders) and self.active_loaders[-1].at_last_batch

    def sync_next(self) -> bool:
        """Called by a prepared model's forward: will the coming backward complete the window?"""
        index = 0 if self.closing else self.micro
        return index >= self.k - 1 or self.end_of_loader

    def before_backward(self) -> None:
        self.backward_used = True
        if self.closing:
            self.micro, self.closing = 0, False
        self.micro += 1

    def at_boundary(self) -> bool:
        """Should optimizer.step() / zero_grad() act now?"""
        if not self.backward_used:
            if self.k > 1:
                raise RuntimeError(
                    f"--grad-accum {self.k} needs nbtrain.backward(loss) in place of loss.backward(), "
                    "so nbtrain knows where each micro-step ends and scales the loss by 1/K.")
            return True
        return self.closing or self.micro >= self.k or (self.end_of_loader and self.micro > 0)

    def zeroes_now(self) -> bool:
        """Should zero_grad() act now? At a window's end, and before the first backward of the cell too — a loop
        that zeroes first (``opt.zero_grad(); …; nbtrain.backward(loss); opt.step()``) has not yet said which
        backward it uses: that is checked where it steps."""
        return not self.backward_used or self.at_boundary()

    def on_step(self) -> None:
        self.closing = True

