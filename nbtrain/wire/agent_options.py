"""The options a node agent takes from the notebook, declared once: the cell's (and ``%distributed_nodes``')
``--preemption-url``, and the agent's own command-line option of the same name.

The kernel passes them on the command line of each agent it starts (``--emulate``, ``--hosts``, ``--slurm``:
:mod:`nbtrain.kernel.cluster`); an agent started by hand takes the option or its ``NBTRAIN_*`` variable
(:mod:`nbtrain.node.main`). The URL is checked here, on both sides, before anything starts.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from .options import option


class PreemptionURLError(ValueError):
    """``--preemption-url`` is not an http(s) URL."""


@dataclass(frozen=True)
class AgentOptions:
    preemption_url: str | None = option(
        None, "--preemption-url", "the cloud's metadata URL that announces a spot reclaim or preemption (AWS spot/"
        "instance-action, GCP instance/preempted, Azure scheduledevents), polled every few seconds by the node "
        "agents nbtrain starts (--emulate, --hosts, --slurm)", group="placement", metavar="URL",
        env="NBTRAIN_PREEMPTION_URL")


def check_url(url: str) -> str:
    """``url`` if it can be the metadata service's (http or https, with a host); else :class:`PreemptionURLError`."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise PreemptionURLError(f"--preemption-url takes the cloud's metadata URL, such as "
                                 f"http://169.254.169.254/latest/meta-data/spot/instance-action (got {url!r})")
    return url
