"""`make test-cpu`'s table (tests/cpu_time.py): files ranked by the CPU seconds of their tests, own and children."""

from tests.cpu_time import summary


def test_files_are_ranked_by_their_tests_cpu_seconds():
    records = [
        {"test": "tests/a.py::one", "own": 1.0, "children": 2.0, "wall": 5.0},
        {"test": "tests/b.py::one", "own": 2.0, "children": 0.0, "wall": 9.0},
        {"test": "tests/a.py::two[x]", "own": 0.0, "children": 5.0, "wall": 1.0},
    ]
    header, first, second, total = summary(records)
    assert header.split()[-1] == "file"
    assert first.split() == ["8", "80.0%", "1", "7", "6", "2", "tests/a.py"]
    assert second.split() == ["2", "20.0%", "2", "0", "9", "1", "tests/b.py"]
    assert total.split()[:2] == ["10", "in"] and total.endswith("3 tests in 2 files")
    assert len(summary(records, top=1)) == 3


def test_a_run_that_took_no_cpu_is_a_table_of_zeros():
    lines = summary([{"test": "tests/a.py::one", "own": 0.0, "children": 0.0, "wall": 0.0}])
    assert lines[1].split()[:2] == ["0", "0.0%"] and lines[-1].endswith("1 tests in 1 files")
