"""Modules end on an expected error through one helper: fail_json with "what: the error", the
result gathered so far, and nothing after the failing block run."""

from __future__ import annotations

import pytest

from sglang_fleet.node.common.failing import failing


class Module:
    """AnsibleModule's fail_json as it behaves: records the call and exits."""

    def __init__(self):
        self.failed = None

    def fail_json(self, **kwargs):
        self.failed = kwargs
        raise SystemExit(1)


def test_an_expected_error_fails_the_module_naming_what_failed():
    module = Module()
    with pytest.raises(SystemExit), failing(module, OSError, "cannot write the files"):
        raise OSError("disk full")
    assert module.failed == {"msg": "cannot write the files: disk full"}


def test_without_what_the_error_is_the_message_and_the_result_is_kept_as_filled_in():
    module, result = Module(), {"changed": False}
    ran_after = []
    with pytest.raises(SystemExit):
        with failing(module, ValueError, result=result):
            result["changed"] = True
            raise ValueError("config_hash mismatch")
        ran_after.append(True)
    assert module.failed == {"msg": "config_hash mismatch", "changed": True}
    assert ran_after == []


def test_nested_groups_each_say_their_own_prefix_and_other_errors_pass_through():
    class Refused(Exception):
        pass

    def run(error):
        module = Module()
        with pytest.raises(SystemExit), \
                failing(module, OSError, "host a: checking the node failed"), \
                failing(module, Refused, "host a"):
            raise error
        return module.failed["msg"]

    assert run(Refused("port taken")) == "host a: port taken"
    assert run(OSError("no such file")) == "host a: checking the node failed: no such file"
    module = Module()
    with pytest.raises(KeyError), failing(module, OSError, "x"):
        raise KeyError("not expected")
    assert module.failed is None


def test_no_error_leaves_the_module_running():
    module = Module()
    with failing(module, OSError, "x"):
        value = 1
    assert value == 1 and module.failed is None
