"""StopScanner (openai/stops.py): the first stop sequence found across streamed pieces, and only a possible start held
back."""

from __future__ import annotations

from trtllm_entrypoint.openai.stops import StopScanner


def test_stops_are_found_across_pieces_and_a_possible_start_is_held_back():
    scanner = StopScanner(["END", "\n\n"])
    assert scanner.feed("hello E") == ("hello ", False)  # "E" may start END
    assert scanner.feed("Nx") == ("ENx", False)  # it did not
    assert scanner.feed(" and\n") == (" and", False)
    assert scanner.feed("\nrest") == ("", True)


def test_without_stops_everything_passes_and_a_held_tail_is_flushed():
    plain = StopScanner([])
    assert plain.feed("E") == ("E", False) and plain.flush() == ""
    tail = StopScanner(["STOP"])
    assert tail.feed("abcST") == ("abc", False) and tail.flush() == "ST" and tail.flush() == ""


def test_the_earliest_of_several_stops_wins():
    assert StopScanner(["cd", "b"]).feed("abcd") == ("a", True)
