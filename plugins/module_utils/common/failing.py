# -*- coding: utf-8 -*-
# How a module's main() ends on an error it expects: fail_json with one message form
# ("what: the error"), the result gathered so far kept, never a traceback.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from contextlib import contextmanager


@contextmanager
def failing(module, errors, what="", result=None):
    """Any of `errors` raised inside ends the run: fail_json(msg="what: error", or the error
    alone without `what`) with `result`'s items as they are when it is raised (a dict the
    block fills in). fail_json exits, so nothing after the block runs on an error."""
    try:
        yield
    except errors as exc:
        module.fail_json(msg="%s: %s" % (what, exc) if what else str(exc), **(result or {}))


def controller_only(name, argument_spec):
    """main() of a module that only documents its action plugin: run on a node (the action
    plugin missing), it fails saying how to call it."""
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    module.fail_json(msg="%s runs on the controller through its action plugin (call it as "
                         "sglang.fleet.%s with the collection installed)" % (name, name))
