# -*- coding: utf-8 -*-
# The server's port and HTTP status codes, asked with the standard library only: the node
# check asks /health with it before the rest of its code is loaded.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import socket
import threading
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

# A request between observations waits this long at most (a ready server answers in about a
# second); a slower answer is left to the next observation, which waits the full
# health_timeout. A phase change with the port open is reported after this long at most, unless
# /health answers 200 first: otherwise the ready verdict would come a module run later.
HEALTH_GRACE_S = 2.0


def port_open(host, port, timeout=1.0):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, socket.timeout):
        return False


def http_status(url, timeout):
    """Status code, or None when no answer came within the timeout."""
    try:
        with urlopen(Request(url), timeout=timeout) as response:
            return response.status
    except HTTPError as exc:
        return exc.code
    except (URLError, socket.timeout, OSError, ValueError):
        return None


class HealthAsked(threading.Thread):
    """/health asked once in the background, as the gate asks it between observations (at
    most HEALTH_GRACE_S): SGLang answers a ready server a second later at the soonest, since
    it waits for a one-token generation. `answered()` is True for a 200."""

    def __init__(self, host, port, health_timeout):
        super(HealthAsked, self).__init__(daemon=True)
        self.url = "http://%s:%d/health" % (host, port)
        self.timeout = min(float(health_timeout), HEALTH_GRACE_S)
        self.status = None

    def run(self):
        self.status = http_status(self.url, self.timeout)

    def answered(self):
        self.join()
        return self.status == 200


def ask_health_early(raw_params):
    """The node check's /health, asked from its module's options as Ansible handed them over,
    before they are validated: None when they do not name a server that serves HTTP, or in
    check mode (which takes no observation). The validated options decide whether the answer
    is used."""
    gate = (raw_params or {}).get("gate")
    if not isinstance(gate, dict) or raw_params.get("_ansible_check_mode"):
        return None
    try:
        if gate.get("serves_http") is False:
            return None
        ask = HealthAsked(gate.get("host") or "127.0.0.1", int(gate["port"]),
                          gate.get("health_timeout") or HEALTH_GRACE_S)
    except (KeyError, TypeError, ValueError):
        return None
    ask.start()
    return ask
