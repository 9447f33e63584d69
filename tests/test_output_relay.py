"""OutputRelay on its own: what the cell shows for what the ranks print, chunk by chunk."""

from __future__ import annotations

from helpers.runhelp import Captured

from nbtrain.kernel.relay.output import HOLD_MAX, OutputRelay
from nbtrain.wire.protocol import END_MARK


def relay(nprocs: int = 2, shown=None) -> tuple[OutputRelay, Captured]:
    cell = Captured()
    return OutputRelay(cell, nprocs, shown), cell


def test_partial_lines_of_two_ranks_are_written_whole():
    out, cell = relay()
    out.feed(0, "stdout", "epoch 1 ... ")
    out.feed(1, "stdout", "epoch 1 ... ")
    out.feed(1, "stdout", "done\n")
    out.feed(0, "stdout", "do")
    out.feed(0, "stdout", "ne\nnext")
    out.flush()
    assert cell.text("stdout") == "[rank 1] epoch 1 ... done\nepoch 1 ... done\nnext\n"


def test_a_line_split_across_chunks_is_one_line_with_one_prefix():
    out, cell = relay()
    for chunk in ("ab", "c", "d\ne", "f\n"):
        out.feed(1, "stdout", chunk)
    assert cell.text("stdout") == "[rank 1] abcd\n[rank 1] ef\n"


def test_the_end_of_the_cell_writes_held_lines_with_a_newline():
    out, cell = relay()
    out.feed(0, "stdout", "last words")
    out.feed(1, "stderr", "no newline")
    assert cell.parts == []
    out.flush()
    assert cell.text("stdout") == "last words\n" and cell.text("stderr") == "[rank 1] no newline\n"
    out.flush()
    assert cell.text("stdout") == "last words\n"  # nothing twice


def test_one_shown_rank_is_written_as_it_arrives_and_ended_with_a_newline():
    out, cell = relay(nprocs=2, shown=0)
    out.feed(0, "stdout", "epoch 1 ... ")
    out.feed(1, "stdout", "hidden\n")
    assert cell.text("stdout") == "epoch 1 ... "
    out.flush()
    assert cell.text("stdout") == "epoch 1 ... \n"
    assert out.tail(1) == ["hidden"]


def test_output_rank_k_shows_rank_k_only_with_its_prefix():
    out, cell = relay(nprocs=2, shown=1)
    out.feed(0, "stdout", "zero\n")
    out.feed(1, "stderr", "\r 10%\r 20%")
    out.flush()
    assert cell.text("stdout") == "" and cell.text("stderr") == "\r[rank 1]  10%\r[rank 1]  20%\n"


def test_a_held_line_longer_than_the_limit_is_written_anyway():
    out, cell = relay()
    out.feed(1, "stdout", "x" * (HOLD_MAX - 1))
    assert cell.parts == []
    out.feed(1, "stdout", "yy")
    assert cell.text("stdout") == "[rank 1] " + "x" * (HOLD_MAX - 1) + "yy\n"
    out.feed(1, "stdout", "z\n")
    assert cell.text("stdout").endswith("\n[rank 1] z\n")


def test_carriage_returns_redraw_a_held_line():
    out, cell = relay()
    out.feed(1, "stderr", "\r  0%|      |")
    out.feed(1, "stderr", "\r 50%|###   |\r100%|######|")
    assert cell.parts == []
    out.feed(1, "stderr", "\n")
    assert cell.text("stderr") == "[rank 1] 100%|######|\n"
    out.feed(1, "stdout", "abcdef\rXY\r\n")  # a shorter redraw overwrites only the start, as in a terminal
    assert cell.text("stdout") == "[rank 1] XYcdef\n"


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
    assert cell.text("stdout") == "[rank 1] tail\n" and out.ended(1, 7) and not out.ended(0, 7)


def test_the_lines_of_one_chunk_are_written_at_once():
    out, cell = relay()
    out.feed(1, "stdout", "".join(f"{i}\n" for i in range(1000)))
    assert len(cell.parts) == 1 and cell.text("stdout").count("[rank 1] ") == 1000


def test_a_control_character_that_starts_no_mark_is_shown():
    out, cell = relay()
    out.feed(0, "stdout", f"{END_MARK[0]}x\n")
    assert cell.text("stdout") == f"{END_MARK[0]}x\n"


def test_a_hidden_rank_keeps_its_last_lines_for_a_failure_report():
    out, cell = relay(nprocs=2, shown=0)
    out.feed(1, "stdout", "".join(f"line {i}\n" for i in range(30)) + "unfinished")
    out.feed(1, "stderr", " 10%|#     |\r100%|######|\nTraceback (most recent call last):\n")
    assert cell.parts == []
    tail = out.tail(1)
    assert len(tail) == 20 and tail[-4:] == ["line 29", "unfinished", "100%|######|", "Traceback (most recent call last):"]
