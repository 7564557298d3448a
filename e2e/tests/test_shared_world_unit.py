"""Turns of the shared e2e world (kvgate_e2e.shared_world.Turns): who may use the world at once.
Each ``Turns`` here stands for one pytest-xdist worker (its own lock descriptors); no cluster."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kvgate_e2e.polling import poll_until
from kvgate_e2e.shared_world import Turns, record_finished

# A deadline: a waiting worker thread taking its turn once the holder let go of the lock file.
TURN_DEADLINE = 10


class OtherWorker:
    """Another worker's turn, from a thread: ``holding`` is set once it holds the world; the
    turn ends at ``finish()``."""

    def __init__(self, turns: Turns, *, alone: bool) -> None:
        self.holding, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(turns, alone), daemon=True)
        self._thread.start()

    def _run(self, turns: Turns, alone: bool) -> None:
        with turns.hold(alone=alone):
            self.holding.set()
            self._release.wait(30)

    def finish(self) -> None:
        self._release.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def test_a_shared_turn_waits_while_another_worker_has_the_world_alone(tmp_path: Path) -> None:
    lone = Turns(tmp_path)
    with lone.hold(alone=True):
        other = OtherWorker(Turns(tmp_path), alone=False)
        assert not other.holding.wait(0.5)  # kept out while the lone turn runs
    poll_until(
        "the other worker's turn once the lone one ended", other.holding.is_set, TURN_DEADLINE
    )
    other.finish()


def test_a_lone_turn_lets_waiting_workers_in_once_it_shares_the_rest(tmp_path: Path) -> None:
    lone = Turns(tmp_path)
    with lone.hold(alone=True):
        other = OtherWorker(Turns(tmp_path), alone=False)
        assert not other.holding.wait(0.5)
        assert lone.share_rest()  # the lone test's clean-up
        poll_until("the waiting worker to share the world", other.holding.is_set, TURN_DEADLINE)
        third = OtherWorker(Turns(tmp_path), alone=True)
        assert not third.holding.wait(0.5)  # a lone turn still waits for both
    other.finish()
    poll_until("the third worker's lone turn once both ended", third.holding.is_set, TURN_DEADLINE)
    third.finish()
    assert not lone.holding


def test_only_a_lone_turn_this_worker_holds_can_be_shared(tmp_path: Path) -> None:
    turns = Turns(tmp_path)
    assert not turns.share_rest()  # no turn at all
    with turns.hold(alone=False):
        assert turns.holding
        assert not turns.share_rest()  # already shared
    with turns.hold(alone=True):
        with turns.hold(alone=True):  # free inside the lone turn
            pass
        assert turns.share_rest()
        with pytest.raises(Exception, match="cannot take it alone"), turns.hold(alone=True):
            pass
    assert not turns.holding


def test_files_without_a_lone_test_start_once_every_lone_test_has_finished(
    tmp_path: Path,
) -> None:
    turns = Turns(tmp_path)
    lone = {"e2e/tests/test_a.py::test_alone", "e2e/tests/test_b.py::test_with_lws"}
    assert turns.after_lone_tests(set(), 10) < 1.0  # no lone test in this session
    record_finished(tmp_path, "e2e/tests/test_a.py::test_alone")
    record_finished(tmp_path, "e2e/tests/test_c.py::test_shared")
    assert turns.after_lone_tests(lone, 0.6) >= 0.6  # one still running: waited it out

    started = threading.Event()
    waited: list[float] = []

    def shared_test() -> None:
        started.set()
        waited.append(turns.after_lone_tests(lone, 30))

    thread = threading.Thread(target=shared_test, daemon=True)
    thread.start()
    started.wait(5)
    assert not waited
    record_finished(tmp_path, "e2e/tests/test_b.py::test_with_lws")  # its worker crashed
    thread.join(10)
    assert waited and waited[0] < 10
