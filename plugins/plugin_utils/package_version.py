# -*- coding: utf-8 -*-
# Controller side only: the collection's filter, action and callback plugins run the
# sglang_fleet package's code, so a collection of one release beside a package of another
# would deploy with rules, views and renders that neither release has. Each plugin checks the
# two are the same version before it uses the package, and says how to fix it when not.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import json
import os
import sys

import yaml

PACKAGE = "sglang-fleet"
# plugins/plugin_utils/<this file>: the collection's root is three folders up.
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Every plugin checks as it loads, a dozen per run: the file is read once per process.
@functools.lru_cache(maxsize=None)
def collection_version(root=COLLECTION_ROOT):
    """The collection's version: MANIFEST.json in an installed collection (ansible-galaxy
    writes it), galaxy.yml in a clone."""
    manifest = os.path.join(root, "MANIFEST.json")
    if os.path.isfile(manifest):
        with open(manifest) as handle:
            return str(json.load(handle)["collection_info"]["version"])
    with open(os.path.join(root, "galaxy.yml")) as handle:
        return str(yaml.safe_load(handle)["version"])


def mismatch(collection, package):
    """None when the versions match, else the message that names both and the fix."""
    if collection == package:
        return None
    return ("the collection sglang.fleet is version %s but the Python package %s that its "
            "plugins import is version %s (%s); the two must be the same release. Fix: "
            "pip install '%s==%s' into the Python that runs ansible-playbook, or, in a clone "
            "of the repository, `pip install -e .` there" % (
                collection, PACKAGE, package, sys.executable, PACKAGE, collection))


def package_mismatch(root=COLLECTION_ROOT):
    """Compare the imported sglang_fleet package with the collection at `root`."""
    import sglang_fleet

    return mismatch(collection_version(root), sglang_fleet.__version__)


def version_error(root=COLLECTION_ROOT):
    """package_mismatch, or None where the package is not importable at all (the plugin's own
    import of it reports that, with its own fix)."""
    try:
        return package_mismatch(root)
    except ImportError:
        return None


def require_matching_package(root=COLLECTION_ROOT):
    """For a plugin that fails as it loads (an action plugin: the task reports the error)."""
    problem = version_error(root)
    if problem:
        from ansible.errors import AnsibleError

        raise AnsibleError(problem)
