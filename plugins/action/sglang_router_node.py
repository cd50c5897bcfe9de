# -*- coding: utf-8 -*-
# Controller side of sglang_router_node: its RouterSpec view (sglang_fleet.router.views.VIEWS).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.sglang.fleet.plugins.plugin_utils.spec_view import ActionModule  # noqa: F401
