# -*- coding: utf-8 -*-
# Controller side of sglang_evidence_fetch: one ansible.builtin.fetch of the bundle's archive
# (its checksum check and become handling), unpacked here. A fetch per file ran a remote stat
# module per file, most of a recovery's evidence stage.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shlex
import tarfile
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

SUFFIX = ".tar.gz"


def safe_members(tar, folder):
    """The archive's members, each a plain file or folder under `folder`; anything else
    (a link, a device, an absolute or '..' path) refuses the whole archive."""
    members = tar.getmembers()
    for m in members:
        parts = m.name.split("/")
        if (m.name.startswith("/") or ".." in parts or parts[0] != folder
                or not (m.isfile() or m.isdir())):
            raise AnsibleActionFail("sglang_evidence_fetch: the archive holds %r, which is not "
                                    "a plain file or folder under %s/; nothing unpacked"
                                    % (m.name, folder))
    return members


def make_private(root):
    """Folders 0700, files 0600: the bundle holds settings, logs and command lines."""
    os.chmod(root, 0o700)
    for where, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(where, d), 0o700)
        for f in files:
            os.chmod(os.path.join(where, f), 0o600)


class ActionModule(ActionBase):
    # The fetch it calls makes (and removes) any remote temporary folder it needs.
    _VALID_ARGS = frozenset(("src", "dest"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        src = self._task.args.get("src") or ""
        dest = os.path.expanduser(str(self._task.args.get("dest") or ""))
        if not dest:
            raise AnsibleActionFail("sglang_evidence_fetch: dest is required")
        if not src:
            result.update(changed=False, dest=dest, files=[], msg="no archive (check mode)")
            return result
        folder = os.path.basename(src)
        if not folder.endswith(SUFFIX):
            raise AnsibleActionFail("sglang_evidence_fetch: src %r is not a %s archive from "
                                    "sglang_evidence" % (src, SUFFIX))
        folder = folder[:-len(SUFFIX)]
        target = os.path.join(dest, folder)
        if self._task.check_mode:
            result.update(changed=True, dest=target, files=[])
            return result
        os.makedirs(dest, mode=0o700, exist_ok=True)
        fd, local = tempfile.mkstemp(prefix=".%s." % folder, suffix=SUFFIX, dir=dest)
        os.close(fd)
        try:
            fetched = self._fetch(src, local, task_vars)
            if fetched.get("failed"):
                result.update(fetched)
                return result
            with tarfile.open(local, "r:gz") as tar:
                members = safe_members(tar, folder)
                # Members checked above; the 'data' filter too where this Python has it.
                tar.extractall(dest, members=members, **(
                    {"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        finally:
            os.unlink(local)
        make_private(dest)
        # The folder stays on the node; the archive was only the transfer.
        self._low_level_execute_command("rm -f -- %s" % shlex.quote(src), sudoable=True)
        files = sorted(m.name.split("/", 1)[1] for m in members if m.isfile())
        result.update(changed=True, dest=target, files=files)
        return result

    def _fetch(self, src, local, task_vars):
        task = self._task.copy()
        task.args = {"src": src, "dest": local, "flat": True}
        fetch = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.fetch", task=task, connection=self._connection,
            play_context=self._play_context, loader=self._loader, templar=self._templar,
            shared_loader_obj=self._shared_loader_obj)
        return fetch.run(task_vars=task_vars)
