"""The garbage collector paused through a process's imports (trainers/collector.py)."""

import gc

import pytest

from grpoflow.trainers import collector


@pytest.fixture
def restore_collector():
    yield
    gc.unfreeze()
    gc.enable()


@pytest.mark.usefixtures("restore_collector")
def test_pause_then_resume_freezes_what_exists_and_turns_the_collector_back_on():
    collector.pause()
    assert not gc.isenabled()
    made = [[i] for i in range(1000)]  # objects made while paused
    collector.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)
    frozen = gc.get_freeze_count()
    more = [[i] for i in range(1000)]  # a second freeze would take these
    collector.resume()  # a second call freezes nothing more (frozen objects can still be freed meanwhile)
    assert gc.isenabled() and gc.get_freeze_count() < frozen + len(more)


@pytest.mark.usefixtures("restore_collector")
def test_resume_without_a_pause_freezes_nothing():
    gc.unfreeze()
    collector.resume()
    assert gc.isenabled() and gc.get_freeze_count() == 0
