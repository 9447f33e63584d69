"""A ``--ft`` run's replica groups as badges: each group's state, in a colour of its own, above the device panel.

``in quorum`` (green) steps with the others; ``out`` (red) was lost and is being ended, or was not brought back;
``recovering from a peer`` (orange) has new ranks starting in its place that copy a healthy group's state;
``rejoined`` (blue) committed a step with the others again. The row ends with the last quorum's size — how many
groups' gradients the latest committed step averaged (the ``ft_groups`` series, drawn as a curve too). The states
come from the kernel (:class:`~nbtrain.kernel.lifecycle.ft_run.ReplicaWatch`), not from the groups' own words: a
lost group cannot say it is lost.

:func:`badges_html` and :func:`groups_words` are pure functions of the groups (tested without a browser).
"""

from __future__ import annotations

import html
import time

from ..lifecycle.ft_run import GROUPS_SERIES
from ..observers.events import GroupState, ReplicaGroupInfo
from . import text, theme

STATE_COLORS = {GroupState.IN_QUORUM: theme.BUSY_LOW, GroupState.OUT: theme.BUSY_FULL,
                GroupState.RECOVERING: theme.BUSY_HIGH, GroupState.REJOINED: theme.ACCENT}


def _badge(group: ReplicaGroupInfo, now: float) -> str:
    color = STATE_COLORS[group.state]
    replaced = f", replaced {group.replaced}×" if group.replaced else ""
    title = f"{group.name}: {group.state} for {text.duration(max(now - group.since, 0.0))}{replaced}"
    return (f'<span class="nbt-part" title="{html.escape(title)}" style="border:1px solid {color};color:{color};'
            f'border-radius:8px;padding:0 6px;margin-right:4px">{html.escape(group.name)} · {group.state}</span>')


def badges_html(groups: tuple[ReplicaGroupInfo, ...], store=None, now: float | None = None) -> str:
    """One row: a badge per group, then the last committed step's quorum, from ``store`` (the run's
    :class:`~nbtrain.kernel.dashboard.metric_store.MetricStore`; none yet: not shown)."""
    if not groups:
        return ""
    now = time.time() if now is None else now
    series = store.series(GROUPS_SERIES) if store is not None else None
    quorum = series.last_value if series is not None else None
    last = "" if quorum is None else f' <span class="nbt-part">quorum {quorum:.0f} of {len(groups)}</span>'
    return ('<div class="nbt-row nbt-wrap"><b>replica groups</b> '
            + "".join(_badge(group, now) for group in groups) + last + "</div>")


def groups_words(groups: tuple[ReplicaGroupInfo, ...]) -> str:
    """For a status line: ``"groups 2/3 in quorum (rank 2 recovering from a peer)"``; "" without ``--ft``."""
    if not groups:
        return ""
    stepping = [g for g in groups if g.state in (GroupState.IN_QUORUM, GroupState.REJOINED)]
    others = ", ".join(f"{g.name} {g.state}" for g in groups if g not in stepping)
    return f"groups {len(stepping)}/{len(groups)} in quorum" + (f" ({others})" if others else "")
