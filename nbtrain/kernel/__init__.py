"""The notebook kernel's process: the magics, the request, the ranks, a run and everything that follows it.

Sub-packages, each importing only those listed above it (checked by tests/test_layering.py)::

    relay         the ranks' output, displays and prompts, into the cell      (wire only)
    observers     following a run: events, history, registry, runs table, trackers, cost, cold start
    diagnostics   explaining a run: failures, stacks, uneven collectives, advisor, profile
    ranks         PoolSpec, the RankGroup protocol and this machine's group: LocalPool, processes, channel, zygote
    request       the options and the checked configuration, the cell's analysis and inputs
    lifecycle     entry -> restarts -> run: one cell on a rank group; sessions, stop button, waiting
    cluster       several machines: the hub node agents join, NodePool, emulated / ssh / Slurm nodes
    dashboard     the live dashboard under a cell, and %gpus
    magics.py     the magics: parse, then call the plain functions above

The call path, each layer knowing only the one below it (as torchrun's CLI → LaunchConfig → agent →
process context)::

    magics                      parses the magic's arguments                  -> LaunchRequest
    lifecycle.entry             checks everything (request.config.resolve -> LaunchConfig, cell, inputs)
      lifecycle.restarts        runs it again from the checkpoint after a rank died (--max-restarts)
    lifecycle.run               runs one cell on a RankGroup                  -> events to observers
    ranks.pool / cluster.group  the ranks on this machine / on node agents    -> Hello, Ready, Done …
    ───────────────  nbtrain.wire: messages, payload, shared memory, settings  ─────────
    nbtrain.rank.main           one rank: process group, jobs                 (another process)

This package talks to the ranks and node agents only through :mod:`nbtrain.wire`; they never import it.
"""
