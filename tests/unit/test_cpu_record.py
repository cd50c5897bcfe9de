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


def test_a_shared_fixtures_setup_counts_in_the_first_test_that_uses_it(tmp_path):
    """The suite's own `--cpu-by-file`, on a file whose module fixture runs a program before
    its first test: that program's CPU is the first test's, not lost between the tests."""
    import os
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    shutil.copy(tests / "conftest.py", tmp_path / "conftest.py")
    burn = 'subprocess.run([sys.executable, "-c", "sum(range(50_000_000))"], check=True)'
    (tmp_path / "test_shared.py").write_text(
        "import subprocess, sys\nimport pytest\n\n"
        "@pytest.fixture(scope='module')\ndef fleet():\n"
        f"    {burn}\n\n"
        "def test_first(fleet):\n    pass\n\n"
        "def test_second(fleet):\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "0", "-o", "addopts=", "--cpu-by-file", "5",
                          str(tmp_path / "test_shared.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         # An empty reference folder: the session's end stops no warm probe
                         # that this suite's own workers ask.
                         env=dict(os.environ, SGLANG_FLEET_REF_DIR=str(tmp_path / "ref")))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    seconds = {m[1]: float(m[0]) for m in re.findall(r"([\d.]+) s +[\d.]+%  \S+::(\w+)",
                                                     run.stdout)}
    assert seconds["test_first"] > 0.2 > seconds.get("test_second", 0.0), run.stdout
