"""Where a run's ranks come from: the :class:`~.rankgroup.RankGroup` protocol every group implements, and this
machine's group — :class:`~.pool.LocalPool` over the rank processes (:mod:`.procs`) and the authenticated
channel to each (:mod:`.channel`). The group on several machines, :class:`nbtrain.kernel.cluster.group.NodePool`, is its
sibling behind the same protocol.
"""
