from sglang_fleet.testfleet import cpu_record


def test_tests_add_up_by_file_and_the_table_puts_the_costliest_first():
    per_test = {"tests/integration/test_a.py::test_one": 30.0,
                "tests/integration/test_a.py::test_two": 10.0,
                "tests/integration/test_b.py::test_three": 60.0}
    assert cpu_record.by_file(per_test) == {"tests/integration/test_a.py": 40.0,
                                            "tests/integration/test_b.py": 60.0}
    lines = list(cpu_record.table(per_test, top=1))
    assert lines[0].endswith("100 in all")
    assert lines[2].split() == ["60.0", "s", "60.0%", "tests/integration/test_b.py"]
    assert lines[4].split()[-1] == "tests/integration/test_b.py::test_three"
    assert len(lines) == 5


def test_cpu_now_counts_a_waited_for_child():
    import subprocess
    import sys
    before = cpu_record.cpu_now()
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    assert cpu_record.cpu_now() - before > 0.02
