"""The kernel side of ``%%distributed``: configuration, cell analysis, the worker pool, a run.

Layers, each knowing only the one below it (as torchrun's CLI → LaunchConfig → agent → process
context)::

    magics.py        parses the magic's arguments           -> LaunchRequest
    launch.api       checks everything (config.resolve -> LaunchConfig, cell, inputs), then runs
                                                             -> RunResult / RankFailedError
      launch.restarts  runs it again from the checkpoint after a rank died (--max-restarts)
    launch.run       runs one cell on a pool                 -> events to observers
    launch.pool      N rank processes, their channel, store  -> Hello, Ready, Done …
      launch.procs     the process group: start, poll, signal (a multi-machine launcher replaces it)
      launch.channel   the authenticated connection to each rank and its messages
    ───────────────  nbtrain.wire: messages, payload, shared memory, settings  ─────────
    worker.main      one rank: process group, jobs            (the rank side)

This package talks to the ranks only through :mod:`nbtrain.wire`, and the ranks never import it: the
kernel side → wire ← rank side. What only the kernel does with the shared format stays here — explaining
an unsendable variable (:mod:`.inputs`), retrying after a rank died (:mod:`.restarts`).
"""
