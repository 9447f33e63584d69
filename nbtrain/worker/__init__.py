"""The rank side of nbtrain: see :mod:`nbtrain.worker.main`."""
