# -*- coding: utf-8 -*-
# The installed program's own verdict on a command line, before anything starts: SGLang's (or
# the router's) parser and post-parse checks run by the server's interpreter, CPU only, and the
# record of an accepted command line with the parser's code, so that the same arguments and the
# same installed code are not parsed again. Used by the node check, the router's host and the
# sglang_argcheck module.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

from ..common.files import write_json_atomic
from .deployfiles import refuse_link

_FINGERPRINT = (
    "import importlib.util, os, sys\n"
    "for name in sys.argv[1:]:\n"
    "    s = importlib.util.find_spec(name)\n"
    "    o = (s.origin or '') if s else ''\n"
    "    st = os.stat(o) if o and os.path.exists(o) else None\n"
    "    print(o, st.st_mtime_ns if st else 0, st.st_size if st else 0)\n")


def _parser_fingerprint(python, parser):
    """Where the installed parser's code lives and when it (and its package) last changed,
    read by the server's interpreter without importing it (importing SGLang takes seconds)."""
    module = parser.partition(":")[0]
    # Not realpath: a virtualenv's python links to the interpreter it was made from, and sees
    # other packages.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        out = []  # this very interpreter: no second one to start
        for name in (module, module.split(".")[0]):
            try:
                found = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                found = None
            origin = (found.origin or "") if found else ""
            st = os.stat(origin) if origin and os.path.exists(origin) else None
            out.append("%s %s %s" % (origin, st.st_mtime_ns if st else 0,
                                     st.st_size if st else 0))
        return "\n".join(out)
    try:
        proc = subprocess.run([python, "-c", _FINGERPRINT, module, module.split(".")[0]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def args_record(python, parser, args):
    """What a successful argument check is recorded as: the arguments and the parser's code."""
    fingerprint = _parser_fingerprint(python, parser)
    if fingerprint is None:
        return None
    blob = json.dumps({"parser": parser, "args": list(args), "code": fingerprint},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# The installed SGLang's whole verdict before any worker starts, CPU only: its parser, its
# argument resolution and check_server_args, then the parallel topology its tokenizer process
# validates when it publishes the configuration (sglang/launch_server.py run_server,
# sglang/srt/entrypoints/engine.py _launch_subprocesses). A release or a simulator without a
# step skips it.
_PARSE = (
    "import importlib, sys\n"
    "mod, _, fn = sys.argv[1].partition(':')\n"
    "args = getattr(importlib.import_module(mod), fn)(sys.argv[2:])\n"
    "for step in ('resolve_once', 'check_server_args'):\n"
    "    if callable(getattr(args, step, None)):\n"
    "        getattr(args, step)()\n"
    "if callable(getattr(args, 'resolve_once', None)) and mod.startswith('sglang.'):\n"
    "    try:\n"
    "        from sglang.srt.runtime_context import publish\n"
    "    except ImportError:\n"
    "        publish = None\n"
    "    if publish is not None:\n"
    "        publish(args, role='tokenizer')\n"
)


def parse_args(python, parser, args, timeout=180):
    """Let the installed SGLang parse the arguments as the server will. Returns None when it
    accepts them, else (message, rc) with rc None when the parser did not run to an end."""
    cmd = [python, "-c", _PARSE, parser] + list(args)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout)
    except OSError as exc:
        return ("cannot run the server Python %s: %s; check the install step" % (python, exc),
                None)
    except subprocess.TimeoutExpired:
        return "parsing the arguments took over %ss" % timeout, None
    if proc.returncode == 0:
        return None
    lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    final = _final_line(lines)
    if final.startswith(("ModuleNotFoundError", "ImportError")):
        return ("the server Python %s cannot import SGLang's argument parser %s: %s. Fix: "
                "install SGLang into that environment, or use install_mode pip"
                % (python, parser, final), proc.returncode)
    return "SGLang rejected the rendered arguments: %s" % final, proc.returncode


def _final_line(lines):
    """A failed parse's last word: the exception's final line (its message may span lines)
    and where SGLang raised it, or argparse's error line."""
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not frames:
        return lines[-1] if lines else "no message"
    last = frames[-1]
    where = lines[last].strip()
    # `  File "/x/sglang/srt/a.py", line 273, in check_server_args` -> sglang/srt/a.py:273
    path, _, rest = where[len('File "'):].partition('", line ')
    if "/sglang/" in path:
        path = "sglang/" + path.rsplit("/sglang/", 1)[1]
    message = [line for line in lines[last + 1:] if not line.startswith("    ")
               and line.strip() and not set(line.strip()) <= set("^~")]
    return "%s (%s:%s)" % (" ".join(message) or lines[-1], path, rest.split(",")[0])


def record_args_checked(record_file, record):
    """Record an accepted command line in the run folder. A run folder (or record) that is a
    symbolic link is refused before anything is written through it (DeployFilesError)."""
    if record_file and record:
        folder = os.path.dirname(record_file)
        if folder:
            refuse_link(folder, "folder")
        refuse_link(record_file, "file")
        if folder and not os.path.isdir(folder):
            os.makedirs(folder, mode=0o755)  # the run folder, as the deployment's files have it
        write_json_atomic(record_file, {"record": record})
