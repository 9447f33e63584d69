"""nbtrain's matplotlib backend for ranks: ``plt.show()`` shows the figures in the cell.

The pool starts every rank with ``MPLBACKEND=module://nbtrain.rank.figures`` (the kernel's own
``module://matplotlib_inline.backend_inline`` needs an IPython shell, which a rank does not have).
It draws with Agg, like the inline backend, and is not interactive: :func:`show` sends each open
figure as a PNG through :func:`nbtrain.rank.display.display` — on rank 0; other ranks' figures are
dropped — and closes it. Figures left open when the cell ends are shown then
(the end of :func:`nbtrain.rank.display.scope`).

matplotlib imports this module when pyplot first needs a backend, never nbtrain itself: a rank that
does not plot does not load matplotlib.
"""

from __future__ import annotations

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

from . import display

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args, block=None, **kwargs) -> None:
    """Display every open figure in the cell and close them (``block`` means nothing here)."""
    display.show_open_figures()
