"""The kernel side of ``%%distributed``: configuration, cell analysis, payloads, the worker pool, a run.

Layers, each knowing only the one below it (as torchrun's CLI → LaunchConfig → agent → process
context)::

    magics.py        parses the magic's arguments           -> LaunchConfig
    launch.run       runs one cell on a pool                 -> RunResult / RankFailedError
    launch.pool      N rank processes, their channel, store  -> events
      launch.procs     the process group: start, poll, signal (a multi-machine launcher replaces it)
      launch.channel   the authenticated connection to each rank and its messages
    worker.main      one rank: process group, jobs
"""
