"""Files in the shared release cache are replaced whole: parallel callers (xdist workers,
Ansible's forks) run or read them while another caller writes them."""
from __future__ import annotations

from pathlib import Path

from sglang_fleet.known import release_cache


def test_a_reader_of_the_old_file_sees_it_whole_while_it_is_replaced(tmp_path: Path) -> None:
    script = tmp_path / "catalogue_probe.py"
    release_cache.write_text(script, "old = 1\n" * 1000)
    with script.open(encoding="utf-8") as running:
        release_cache.write_text(script, "new = 2\n")
        assert running.read() == "old = 1\n" * 1000
    assert script.read_text(encoding="utf-8") == "new = 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalogue_probe.py"]


def test_json_is_written_through_the_same_path(tmp_path: Path) -> None:
    path = release_cache.write_json(tmp_path / "deep" / "sglang-0.5.23.json", {"b": 1, "a": 2})
    assert path.read_text(encoding="utf-8") == '{\n "a": 2,\n "b": 1\n}\n'
