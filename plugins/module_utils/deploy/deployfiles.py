# -*- coding: utf-8 -*-
# A deployment's files on its node (folders, launch script, env file, unit) written in one pass:
# what changed, a diff per file (a file holding secrets shows only their fingerprints), modes and
# owners, each file replaced atomically (written beside it, flushed, renamed over it).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import difflib
import grp
import hashlib
import os
import pwd
import stat
import tempfile

from ..common.secrets import is_secret_name

# The options of a file to write (sglang_deployment_files, sglang_node's `write`).
FILE_OPTIONS = dict(path=dict(type="path", required=True),
                    content=dict(type="str", required=True),
                    mode=dict(type="str", required=True), owner=dict(type="str"),
                    group=dict(type="str"))
# Only the content is a secret: paths and modes stay readable in the output.
SECRET_FILE_OPTIONS = dict(FILE_OPTIONS, content=dict(type="str", required=True, no_log=True))


class DeployFilesError(Exception):
    pass


def to_write(files, secret_files):
    """The module's file options as plan() takes them: content as bytes, secrets marked."""
    return ([dict(f, content=f["content"].encode("utf-8")) for f in files]
            + [dict(f, content=f["content"].encode("utf-8"), secret=True)
               for f in secret_files])


def _ids(owner, group):
    try:
        uid = pwd.getpwnam(owner).pw_uid if owner else -1
        gid = grp.getgrnam(group).gr_gid if group else -1
    except KeyError as exc:
        raise DeployFilesError("no such user or group on this node: %s" % exc) from None
    return uid, gid


def _short(content):
    return hashlib.sha256(content).hexdigest()[:12]


def masked_env(content):
    """A secret file (an env file, `NAME=value`, or a YAML config file, `name: value`) as a
    diff shows it: every line as it is, but a secret's value, which shows only as its
    fingerprint (a changed key is seen to change, never read)."""
    lines = []
    for line in content.decode("utf-8", "replace").splitlines(True):
        for sep in ("=", ": "):
            name, found, value = line.partition(sep)
            key = name.strip() if sep == "=" else name.strip().replace("-", "_")
            if found and not name.startswith("#") and is_secret_name(key):
                line = "%s%s******** (sha256:%s)\n" % (name, sep, _short(
                    value.strip().encode("utf-8")))
                break
        lines.append(line)
    return "".join(lines)


def refuse_link(path, what):
    """A deployment's folder or file that is a symbolic link is refused, never followed: the
    deploy would change the mode of what it points to (outside the deployment's root) and
    write the server's files there."""
    if os.path.islink(path):
        raise DeployFilesError(
            "%s is a symbolic link (to %s): the deployment's %s must be a real one, the deploy "
            "does not follow links (it would change the mode of the link's target and write "
            "into it). Fix: replace the link by a %s, or set sglang_server_root to a path "
            "without links (e.g. %s)" % (path, os.readlink(path), what, what,
                                         os.path.realpath(path)))


def plan(folders, files):
    """What to do: folders to create or re-mode, files to write or re-mode, with diffs.

    folders: [{path, mode}]; files: [{path, content (bytes), mode, owner, group, secret}]."""
    actions, diffs = [], []
    for folder in folders:
        path, mode = folder["path"], int(folder["mode"], 8)
        refuse_link(path, "folder")
        try:
            st = os.stat(path)
        except OSError:
            actions.append(("mkdir", folder))
            diffs.append({"before_header": path, "after_header": path,
                          "before": "(absent)\n", "after": "(folder, mode %04o)\n" % mode})
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise DeployFilesError("%s exists and is not a folder" % path)
        if stat.S_IMODE(st.st_mode) != mode:
            actions.append(("chmod", folder))
            diffs.append({"before_header": path, "after_header": path,
                          "before": "mode %04o\n" % stat.S_IMODE(st.st_mode),
                          "after": "mode %04o\n" % mode})
    for item in files:
        path, mode, content = item["path"], int(item["mode"], 8), item["content"]
        uid, gid = _ids(item.get("owner"), item.get("group"))
        try:
            st = os.stat(path)
            with open(path, "rb") as f:
                current = f.read()
        except (OSError, IOError):
            st, current = None, None
        wrong_owner = st is not None and ((uid != -1 and st.st_uid != uid)
                                          or (gid != -1 and st.st_gid != gid))
        if current == content and st is not None and stat.S_IMODE(st.st_mode) == mode \
                and not wrong_owner:
            continue
        actions.append(("write", dict(item, uid=uid, gid=gid)))
        header = "%s (mode %04o)" % (path, mode)
        before_header = path if st is None else "%s (mode %04o)" % (
            path, stat.S_IMODE(st.st_mode))
        if item.get("secret"):
            diffs.append({"prepared": env_diff(
                before_header, header, "" if current is None else masked_env(current),
                masked_env(content))})
            continue
        before = "" if current is None else current.decode("utf-8", "replace")
        after = content.decode("utf-8", "replace")
        diffs.append({"before_header": before_header, "after_header": header,
                      "before": before, "after": after})
    return actions, diffs


def env_diff(before_header, after_header, before, after):
    """An env file's diff, prepared here as Ansible would show it. Its content is a no_log
    parameter (it may hold secrets), and Ansible hides every string of a result that holds
    such a value whole: as 'after', an env file with no secret in it would read
    VALUE_SPECIFIED_IN_NO_LOG_PARAMETER. Every line of a unified diff is prefixed, so the
    content (always several lines: the managed-by header and the deployment's variables)
    never appears whole in it."""
    def lines(text):
        out = text.splitlines(True)
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n\\ No newline at end of file\n"
        return out
    diff = "".join(difflib.unified_diff(lines(before), lines(after),
                                        "before: " + before_header, "after: " + after_header,
                                        "", "", n=3))
    if not diff and before_header != after_header:  # the mode alone changes: say so
        diff = "--- before: %s\n+++ after: %s\n" % (before_header, after_header)
    return diff + "\n" if diff else ""


def apply(actions):
    """Carry out a plan; the paths changed."""
    changed = []
    for kind, item in actions:
        path = item["path"]
        mode = int(item["mode"], 8)
        if kind == "mkdir":
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)  # makedirs' mode is filtered by the umask
        elif kind == "chmod":
            os.chmod(path, mode)
        else:
            _write_atomic(path, item["content"], mode, item["uid"], item["gid"])
        changed.append(path)
    return changed


def _write_atomic(path, content, mode, uid, gid):
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        # Mode (and owner) first, so a secret is never readable by others, not even briefly.
        os.fchmod(fd, mode)
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
