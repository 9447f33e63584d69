"""The final picture's step split: one stacked bar per rank — data, forward, backward, comm, optimizer, other.

Each rank's split is the percent of its steps' time it sent when the cell ended (:mod:`nbtrain.rank.train.stepsplit`,
in the step meter's fact, gathered by :func:`~nbtrain.kernel.diagnostics.setup_facts.splits_of`); a cell that trained on no prepared optimizer has none, and the picture no such row.
Bars side by side show a straggler at a glance: the rank whose data share is four times the others', or the one
rank whose comm share is small because every other rank waits for it at each all-reduce.
"""

from __future__ import annotations

from . import theme

PHASE_COLORS = {"data": "#d62728", "forward": "#1f77b4", "backward": "#2ca02c", "comm": "#ff7f0e",
                "optimizer": "#9467bd", "other": theme.OTHER_COLOR}
LABEL_AT_PCT = 8.0  # a segment this wide or wider carries its percent


def draw_step_split(ax, splits: dict[int, dict[str, float]]) -> None:
    """Stacked horizontal bars on ``ax``, rank 0 on top, one colour per phase and one legend for all."""
    ranks = list(splits)
    for row, rank in enumerate(ranks):
        left = 0.0
        for phase, share in splits[rank].items():
            ax.barh(row, share, left=left, color=PHASE_COLORS.get(phase, theme.OTHER_COLOR),
                    label=phase if row == 0 else None, height=0.7)
            if share >= LABEL_AT_PCT:
                ax.text(left + share / 2, row, f"{share:.0f}%", ha="center", va="center", color="white",
                        fontsize=theme.TICK_SIZE)
            left += share
    ax.set_yticks(range(len(ranks)), [f"rank {rank}" for rank in ranks], fontsize=theme.TICK_SIZE)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of each step", fontsize=theme.LABEL_SIZE)
    ax.tick_params(labelsize=theme.TICK_SIZE)
    ax.set_title("Where each step went", fontsize=theme.TITLE_SIZE)
    # a row of one to three bars is lower than six phases in one column: their legend then takes three rows
    columns = 2 if len(ranks) <= 3 else 1
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=theme.LEGEND_SIZE, frameon=False, ncols=columns)
