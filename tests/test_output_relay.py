"""OutputRelay on its own: what the cell shows for what the ranks print, chunk by chunk."""

from __future__ import annotations

from nbtrain.launch.output import HOLD_MAX, OutputRelay
from nbtrain.wire.protocol import END_MARK


class Cell:
    """The relay's writes, and the text as a notebook shows it (\\r returns to the start of the line)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []

    def __call__(self, stream: str, text: str) -> None:
        self.writes.append((stream, text))

    def raw(self, stream: str = "stdout") -> str:
        return "".join(t for s, t in self.writes if s == stream)

    def lines(self, stream: str = "stdout") -> list[str]:
        shown = []
        for line in self.raw(stream).split("\n"):
            screen = ""
            for part in line.split("\r"):
                screen = part + screen[len(part):]
            shown.append(screen)
        return shown


def relay(nprocs: int = 2, shown=None) -> tuple[OutputRelay, Cell]:
    cell = Cell()
    return OutputRelay(cell, nprocs, shown), cell


def test_partial_lines_of_two_ranks_are_written_whole():
    out, cell = relay()
    out.feed(0, "stdout", "epoch 1 ... ")
    out.feed(1, "stdout", "epoch 1 ... ")
    out.feed(1, "stdout", "done\n")
    out.feed(0, "stdout", "do")
    out.feed(0, "stdout", "ne\nnext")
    out.flush()
    assert cell.raw() == "[rank 1] epoch 1 ... done\nepoch 1 ... done\nnext\n"


def test_a_line_split_across_chunks_is_one_line_with_one_prefix():
    out, cell = relay()
    for chunk in ("ab", "c", "d\ne", "f\n"):
        out.feed(1, "stdout", chunk)
    assert cell.raw() == "[rank 1] abcd\n[rank 1] ef\n"


def test_the_end_of_the_cell_writes_held_lines_with_a_newline():
    out, cell = relay()
    out.feed(0, "stdout", "last words")
    out.feed(1, "stderr", "no newline")
    assert cell.writes == []
    out.flush()
    assert cell.raw() == "last words\n" and cell.raw("stderr") == "[rank 1] no newline\n"
    out.flush()
    assert cell.raw() == "last words\n"  # nothing twice


def test_one_shown_rank_is_written_as_it_arrives_and_ended_with_a_newline():
    out, cell = relay(nprocs=2, shown=0)
    out.feed(0, "stdout", "epoch 1 ... ")
    out.feed(1, "stdout", "hidden\n")
    assert cell.raw() == "epoch 1 ... "
    out.flush()
    assert cell.raw() == "epoch 1 ... \n"
    assert out.tail(1) == ["hidden"]


def test_output_rank_k_shows_rank_k_only_with_its_prefix():
    out, cell = relay(nprocs=2, shown=1)
    out.feed(0, "stdout", "zero\n")
    out.feed(1, "stderr", "\r 10%\r 20%")
    out.flush()
    assert cell.raw() == "" and cell.raw("stderr") == "\r[rank 1]  10%\r[rank 1]  20%\n"


def test_a_held_line_longer_than_the_limit_is_written_anyway():
    out, cell = relay()
    out.feed(1, "stdout", "x" * (HOLD_MAX - 1))
    assert cell.writes == []
    out.feed(1, "stdout", "yy")
    assert cell.raw() == "[rank 1] " + "x" * (HOLD_MAX - 1) + "yy\n"
    out.feed(1, "stdout", "z\n")
    assert cell.raw().endswith("\n[rank 1] z\n")


def test_carriage_returns_redraw_a_held_line():
    out, cell = relay()
    out.feed(1, "stderr", "\r  0%|      |")
    out.feed(1, "stderr", "\r 50%|###   |\r100%|######|")
    assert cell.writes == []
    out.feed(1, "stderr", "\n")
    assert cell.raw("stderr") == "[rank 1] 100%|######|\n"
    out.feed(1, "stdout", "abcdef\rXY\r\n")  # a shorter redraw overwrites only the start, as in a terminal
    assert cell.raw() == "[rank 1] XYcdef\n"


def test_rank_0_bar_is_live_and_other_lines_go_above_it():
    out, cell = relay()
    out.feed(0, "stderr", "\r 10%|#     |")
    out.feed(0, "stderr", "\r 20%|##    |")
    assert cell.lines("stderr") == [" 20%|##    |"]
    out.feed(1, "stderr", "\r 10%|#     |")  # rank 1's bar: held
    out.feed(1, "stderr", "warn\n")
    out.feed(0, "stderr", "\r 30%|###   |\n")
    out.feed(1, "stderr", "\r 30%|###   |\r100%|######|\n")
    out.flush()
    assert cell.lines("stderr") == ["[rank 1]  10%|#     |warn", " 30%|###   |", "[rank 1] 100%|######|",
                                    "nbtrain: progress bars of rank 1 were shown once finished (rank 0's live); "
                                    "`--output rank1` shows rank 1's output live.", ""]


def test_end_marks_are_taken_out_even_when_split():
    out, cell = relay()
    mark = f"{END_MARK}7\n"
    out.feed(1, "stdout", "tail" + mark[:3])
    out.feed(1, "stdout", mark[3:])
    out.feed(1, "stderr", mark)
    out.flush()
    assert cell.raw() == "[rank 1] tail\n" and out.ended(1, 7) and not out.ended(0, 7)


def test_the_lines_of_one_chunk_are_written_at_once():
    out, cell = relay()
    out.feed(1, "stdout", "".join(f"{i}\n" for i in range(1000)))
    assert len(cell.writes) == 1 and cell.raw().count("[rank 1] ") == 1000
