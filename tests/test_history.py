"""History and Series in the notebook: every logged point, usable as plain sequences of values."""

from __future__ import annotations

import numpy
import pytest

from nbtrain.kernel.observers.history import History, Series


def history() -> History:
    h = History()
    h.add(0, [(0, 10.0, {"loss": 4.0}), (1, 11.0, {"loss": 2.0, "acc": 0.5})])
    h.add(1, [(0, 10.0, {"loss": 6.0}), (1, 11.0, {"loss": 4.0})])
    return h


def test_a_series_is_a_sequence_of_its_values():
    loss = history()["loss"]
    assert len(loss) == 2 and loss[0] == 4.0 and loss[-1] == 2.0 and list(loss) == [4.0, 2.0]
    assert max(loss) == 4.0 and sum(loss) == 6.0
    assert numpy.asarray(loss).tolist() == [4.0, 2.0] and numpy.asarray(loss, dtype=numpy.float32).dtype == numpy.float32
    tail = loss[1:]
    assert isinstance(tail, Series) and tail.steps == [1] and list(tail) == [2.0] and tail.times == [11.0]


def test_mean_is_a_series_over_the_ranks_at_each_step():
    mean = history().mean("loss")
    assert isinstance(mean, Series) and mean.steps == [0, 1] and list(mean) == [5.0, 3.0]


def test_matplotlib_plots_a_series_directly():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots()
    try:
        (line,) = axes.plot(history()["loss"])
        assert line.get_ydata().tolist() == [4.0, 2.0]
        (line,) = axes.plot(history()["loss"].steps, history().mean("loss"))
        assert line.get_ydata().tolist() == [5.0, 3.0]
    finally:
        plt.close(figure)
