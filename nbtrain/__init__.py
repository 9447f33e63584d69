"""nbtrain: distributed PyTorch training from a Jupyter cell.

``%load_ext nbtrain`` registers the magics; ``%%distributed N`` runs a cell as N DDP ranks. Importing
nbtrain does nothing else: no torch import, no NVML, no processes until a cell asks for them.
"""

__version__ = "0.1.0"


def log(step=None, **values):
    """Inside a ``%%distributed`` cell: record metrics (numbers or tensors) for the dashboard and ``history``.

    ``nbtrain.log(loss=loss)`` does not wait for the GPU; values are sent in batches a few times a second.
    """
    from .worker.metrics import log as _log

    _log(step, **values)


def load_ipython_extension(ipython):
    from .magics import DistributedMagics

    magics = DistributedMagics(ipython)
    ipython.register_magics(magics)
    ipython._nbtrain_magics = magics


def unload_ipython_extension(ipython):
    magics = getattr(ipython, "_nbtrain_magics", None)
    if magics is not None:
        magics.pools.shutdown()
        del ipython._nbtrain_magics
