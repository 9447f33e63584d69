"""What a run holds and what it costs: GPU-hours (core-hours on the CPU) and ``--price-per-gpu-hour``.

A run is metered by what it holds for as long as it lasts, counted from the pool it runs on:

* on GPUs, the GPUs its ranks use — on one machine the distinct GPUs of ``cuda:(rank % len(gpus))`` (several
  gloo ranks on one GPU hold it once), with ``--nodes`` one per rank on every node (each takes
  ``cuda:LOCAL_RANK``);
* on the CPU, the cores its ranks run on: per machine, its ranks × their threads (``OMP_NUM_THREADS``, given
  with ``--env`` or by the kernel, else the cores divided among the ranks, as the ranks are started), at most
  the machine's cores.

``hours = count × seconds / 3600``; with a price (per GPU-hour, or per core-hour on the CPU) the cost is
``hours × price``, in whatever currency the price is in. :class:`Metering` is the count and the price, so
the live dashboard, the summary line and ``nbtrain.runs()`` apply it to their own elapsed time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class PriceError(ValueError):
    """``--price-per-gpu-hour`` is not a price."""


@dataclass(frozen=True)
class Metering:
    unit: str  # "GPU" or "core"
    count: int  # how many of them the run holds
    price: float | None = None  # per unit and hour; None: no price given

    def hours(self, seconds: float) -> float:
        return self.count * max(0.0, seconds) / 3600.0

    def cost(self, seconds: float) -> float | None:
        return None if self.price is None else self.hours(seconds) * self.price

    def words(self, seconds: float) -> str:
        """``0.0011 GPU-hours · cost 0.0028`` (``core-hours`` on the CPU); without a price only the hours."""
        said = f"{amount(self.hours(seconds))} {self.unit}-hours"
        cost = self.cost(seconds)
        return said if cost is None else f"{said} · cost {amount(cost)}"


def amount(value: float) -> str:
    """A number of hours or money, short: 2 decimals from 1 up, else 2 significant digits (0.0011)."""
    return f"{value:,.2f}" if value >= 1 or value == 0 else f"{value:.2g}"


def parse_price(value) -> float | None:
    """The price per GPU-hour given (text from the environment, or a number), checked: a finite number ≥ 0."""
    if value is None:
        return None
    try:
        price = float(value)
    except (TypeError, ValueError):
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise PriceError(f"--price-per-gpu-hour takes the price of one GPU for an hour (of one core on the CPU), a "
                         f"number of 0 or more such as --price-per-gpu-hour 2.5 (got {value!r}).")
    return price


def omp_threads(env: Mapping[str, str]) -> int | None:
    """The ``OMP_NUM_THREADS`` the ranks get from ``env``, if it sets a usable one."""
    text = str(env.get("OMP_NUM_THREADS", "")).strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def cores_held(cpus: int, ranks: int, threads: int | None) -> int:
    """The cores ``ranks`` ranks of ``threads`` threads each run on, on a machine of ``cpus`` cores."""
    per_rank = threads or max(1, cpus // max(1, ranks))
    return min(cpus, ranks * per_rank)


def metering_for(spec, nodes: Sequence = (), price: float | None = None, world_size: int | None = None) -> Metering:
    """What the ranks of pool ``spec`` hold (a :class:`~nbtrain.kernel.request.config.PoolSpec`); ``nodes``: a
    ``--nodes`` run's machines (:class:`~.events.NodeInfo`, whose ``cpus`` their agents reported);
    ``world_size``: the ranks an elastic group formed with (default: the spec's)."""
    several = spec.nodes is not None
    ranks = spec.nprocs if world_size is None else world_size
    if spec.device_type == "cuda":
        count = ranks if several else min(ranks, len(spec.gpu_ids))
        return Metering("GPU", count, price)
    threads = omp_threads(dict(spec.env))
    if several and nodes:
        count = sum(cores_held(node.cpus or len(node.ranks), len(node.ranks), threads) for node in nodes)
    else:
        threads = threads or omp_threads(os.environ)
        count = cores_held(os.cpu_count() or 1, ranks, threads)
    return Metering("core", count, price)
