"""The node side of several machines: ``python -m nbtrain.node --join HOST:PORT --token T``.

A node agent joins the kernel's hub (:mod:`nbtrain.kernel.cluster.hub`) over TLS with the pinned certificate and the
token's secret (:mod:`nbtrain.wire.link`), then, for each pool the kernel starts on it, runs torch elastic's
``LocalElasticAgent`` for its local ranks (:mod:`.agent`) and relays between them and the kernel
(:mod:`.ranks`). It imports ``wire`` and the rank side's process conventions, never the kernel side.
Its life: :mod:`.main`.
"""
