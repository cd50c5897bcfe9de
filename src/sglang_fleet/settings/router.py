"""The one table of `sglang_router_*` settings: name, type, range, default and the router option
each renders. The router's defaults are the pinned release's own (`sglang-router launch --help`,
read into data/router_catalogue/), so an unset variable renders what the router would do anyway.

The sglang_router role's defaults/main.yml and meta/argument_specs.yml are generated from it:

    python -m sglang_fleet.settings --write

and tests/unit/test_router_spec.py fails when they drift or when a default differs from the
pinned release's.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

from sglang_fleet.settings.kinds import Setting, SettingsTable
from sglang_fleet.settings.role_files import RoleFiles

PREFIX = "sglang_router_"
ROLE_DIR = Path(__file__).resolve().parents[3] / "roles" / "sglang_router"


R = partial(Setting, prefix=PREFIX)
TABLE = SettingsTable(PREFIX, (
    # Release and install
    R("version", "str", "0.3.2", "sglang-router release, pinned (a catalogue of its options "
      "ships in sglang_fleet/data/router_catalogue).", "Release"),
    R("pip_package", "str", "sglang-router", "Package pip installs, at sglang_router_version.",
      "Release"),
    R("install_mode", "str", "pip", "pip: a virtualenv of its own at sglang_router_venv; "
      "existing: use the environment of sglang_router_python as it is.", "Release",
      choices=("pip", "existing")),
    R("python", "str", "/usr/bin/python3", "pip: the Python that creates the virtualenv; "
      "existing: the Python of the environment that has sglang-router.", "Release"),
    R("venv", "str", None, "Virtualenv of the router; null: <sglang_router_root>/venv.",
      "Release", nullable=True),
    # Service
    R("root", "str", "/opt/sglang-router", "Folder of the router's files (conf, run, logs, "
      "venv).", "Service"),
    R("service_manager", "str", "systemd", "systemd (real hosts) or supervisor (CI, "
      "containers, the simulated fleet).", "Service", choices=("systemd", "supervisor")),
    R("user", "str", "root", "User the systemd unit runs the router as.", "Service"),
    R("stop_timeout", "int", 200, "Seconds after SIGTERM before SIGKILL; longer than "
      "sglang_router_shutdown_grace_period_secs, or the router's drain is cut.", "Service",
      low=1, high=86400),
    # Listening
    R("host", "str", "0.0.0.0", "Address the router listens on.", "Listening",
      flag="--host", render="value"),
    R("port", "int", 30000, "Port of the router (clients and the worker API).", "Listening",
      low=1, high=65535, flag="--port", render="value"),
    R("prometheus_host", "str", "0.0.0.0", "Address of the router's Prometheus endpoint.",
      "Listening", flag="--prometheus-host", render="value"),
    R("prometheus_port", "int", 29000, "Port of the router's Prometheus endpoint (/metrics).",
      "Listening", low=1, high=65535, flag="--prometheus-port", render="value"),
    R("url", "str", None, "URL clients use; null: http://<host, or the router host's "
      "ansible_host when it listens on all addresses>:<port>.", "Listening", nullable=True),
    # Routing
    R("policy", "str", "cache_aware", "Load-balancing policy (the release's choices; "
      "cache_aware and power_of_two also track each worker's load).", "Routing",
      flag="--policy", render="value"),
    R("request_timeout_secs", "int", 1800, "Seconds a request may take end to end.",
      "Routing", low=1, high=604800, flag="--request-timeout-secs", render="value"),
    R("shutdown_grace_period_secs", "int", 180, "Seconds the router waits for in-flight "
      "requests when it stops.", "Routing", low=0, high=86400,
      flag="--shutdown-grace-period-secs", render="value"),
    R("pd_disaggregation", "bool", False, "PD mode: the router sends each request to one "
      "prefill and one decode server of its workers (a PD deployment's), which join it with "
      "their side; /readiness waits for a healthy one of each.", "Routing",
      flag="--pd-disaggregation", render="switch"),
    R("log_level", "str", "info", "Router log level (debug also logs the worker each request "
      "went to).", "Routing", flag="--log-level", render="value"),
    R("extra_args", "list", [], "Further `sglang-router launch` options, checked against the "
      "pinned release; options the settings above own are refused here.", "Routing",
      elements="str", example='["--max-concurrent-requests", "256"]'),
    # Retries
    R("retry_max_retries", "int", 5, "Attempts per request (a failed send is re-sent to a "
      "worker; a response already streaming cannot be).", "Retries", low=1, high=100,
      flag="--retry-max-retries", render="value"),
    R("retry_initial_backoff_ms", "int", 50, "First backoff, milliseconds.", "Retries",
      low=0, high=600000, flag="--retry-initial-backoff-ms", render="value"),
    R("retry_max_backoff_ms", "int", 30000, "Largest backoff, milliseconds.", "Retries",
      low=0, high=3600000, flag="--retry-max-backoff-ms", render="value"),
    R("retry_backoff_multiplier", "float", 1.5, "Backoff growth per attempt.", "Retries",
      low=1.0, high=100.0, flag="--retry-backoff-multiplier", render="value"),
    R("retry_jitter_factor", "float", 0.2, "Random share of each backoff (0-1).", "Retries",
      low=0.0, high=1.0, flag="--retry-jitter-factor", render="value"),
    R("disable_retries", "bool", False, "Send each request once.", "Retries",
      flag="--disable-retries", render="switch"),
    # Circuit breaker
    R("cb_failure_threshold", "int", 10, "Failures that open a worker's circuit.",
      "Circuit breaker", low=1, high=1000000, flag="--cb-failure-threshold", render="value"),
    R("cb_success_threshold", "int", 3, "Successes in half-open state that close it.",
      "Circuit breaker", low=1, high=1000000, flag="--cb-success-threshold", render="value"),
    R("cb_timeout_duration_secs", "int", 60, "Seconds an open circuit waits before trying "
      "again.", "Circuit breaker", low=1, high=86400, flag="--cb-timeout-duration-secs",
      render="value"),
    R("cb_window_duration_secs", "int", 120, "Sliding window in which failures are counted.",
      "Circuit breaker", low=1, high=86400, flag="--cb-window-duration-secs", render="value"),
    R("disable_circuit_breaker", "bool", False, "Never open a circuit.", "Circuit breaker",
      flag="--disable-circuit-breaker", render="switch"),
    # Health checks
    R("health_failure_threshold", "int", 3, "Failed checks before the router marks a worker "
      "unhealthy.", "Health checks", low=1, high=1000, flag="--health-failure-threshold",
      render="value"),
    R("health_success_threshold", "int", 2, "Passed checks before it is healthy again.",
      "Health checks", low=1, high=1000, flag="--health-success-threshold", render="value"),
    R("health_check_timeout_secs", "int", 5, "Timeout of one check. SGLang's /health runs a "
      "one-token generation and answers within SGLANG_HEALTH_CHECK_TIMEOUT (20 s).",
      "Health checks", low=1, high=3600, flag="--health-check-timeout-secs", render="value"),
    R("health_check_interval_secs", "int", 60, "Seconds between checks of each worker.",
      "Health checks", low=1, high=86400, flag="--health-check-interval-secs", render="value"),
    R("health_check_endpoint", "str", "/health", "Path the router checks on each worker.",
      "Health checks", flag="--health-check-endpoint", render="value"),
    # Secrets
    R("api_key", "str", "", "Key clients must send (Authorization: Bearer) to the router; "
      "kept in the 0600 env file, never on a command line or in output.", "Secrets",
      flag="--api-key", secret=True, render="secret", env="SGLANG_ROUTER_API_KEY"),
    R("control_plane_api_keys", "list", [], "Keys of the worker API: a list of {id, name, "
      "role: admin|user, key}. The fleet manages membership with the first admin key. Kept "
      "like sglang_router_api_key.", "Secrets", flag="--control-plane-api-keys", secret=True,
      elements="dict", render="custom", env="SGLANG_ROUTER_CONTROL_PLANE_KEY_*",
      example="[{id: fleet, name: sglang-fleet, role: admin, key: ...}]"),
    R("drop_secrets", "list", [], "Secret settings the router may start without although it "
      "last started with them (a key removed on purpose); otherwise a secret that resolves to "
      "nothing is refused.", "Secrets", elements="str"),
    R("allow_unauthenticated", "bool", False, "Serve clients or the worker API without a key "
      "on an address other than loopback (refused otherwise).", "Secrets"),
    # Membership
    R("workers_group", "str", "sglang_servers", "Inventory group whose ready servers are this "
      "router's workers (rank 0 only for a multi-node server).", "Membership"),
    R("worker_url", "str", None, "Set on a server host: the URL routers reach it at; null: "
      "http://<its listen address, or its ansible_host when it listens on all "
      "addresses>:<port>.", "Membership", nullable=True),
    R("join_timeout", "int", 60, "Seconds to wait for a router to list a joined worker "
      "healthy.", "Membership", low=1, high=86400),
    R("drain_timeout", "int", 120, "Seconds to wait, after a worker leaves its routers, for its "
      "in-flight requests to finish before it restarts; reported when hit.", "Membership",
      low=0, high=86400),
    R("drain_poll_interval", "float", 1.0, "Seconds between in-flight readings while "
      "draining.", "Membership", low=0.05, high=60.0),
    R("follow_verdicts", "bool", False, "health.yml: also apply membership (ready servers in, "
      "others out) instead of only reporting it; sglang-fleet watch sets it.", "Membership"),
))
del R
SETTINGS: tuple[Setting, ...] = TABLE.rows

SECTION_NOTES = {
    "Release": "Release and how it is installed on the router host",
    "Service": "Service",
    "Listening": "Listening",
    "Routing": "Routing (defaults: the pinned release's own)",
    "Retries": "Retries with exponential backoff",
    "Circuit breaker": "Circuit breaker, per worker",
    "Health checks": "The router's own health checks of its workers",
    "Secrets": "Secrets: set them from ansible-vault or the controller's environment",
    "Membership": "Membership: the gate decides it (ready servers in, others out)",
}

BY_NAME: dict[str, Setting] = TABLE.by_name
BY_VARIABLE: dict[str, Setting] = TABLE.by_variable
SECRET_SETTINGS: tuple[str, ...] = TABLE.secret_variables
OWNED_FLAGS: dict[str, str] = {s.flag: s.variable for s in SETTINGS if s.flag}


def defaults() -> dict[str, Any]:
    return TABLE.defaults()


# membership.yml, entered for a server host by the sglang_server and sglang_recover roles and
# the router and stop playbooks.
MEMBERSHIP_ENTRY = {
    "short_description": "Put this server host in its routers, take it out, or ask them",
    "description": ["Runs for a server host: every router whose sglang_router_workers_group "
                    "holds it is called (delegated to the router's host)."],
    "options": {
        "sglang_server_launch_spec": {
            "type": "dict", "required": True,
            "description": "The server's LaunchSpec (or its identity): its listen address, "
                           "port and rank."},
        "sglang_router_membership_state": {
            "type": "str", "required": True, "choices": ["present", "absent", "query"],
            "description": "present: join once ready; absent: leave; query: compare the "
                           "routers' view with sglang_router_membership_verdict."},
        "sglang_router_membership_drain": {
            "type": "bool", "default": False,
            "description": "With absent, wait for the server's in-flight requests "
                           "(bounded by sglang_router_drain_timeout)."},
        "sglang_router_membership_verdict": {
            "type": "str", "default": "",
            "description": "The gate's verdict, to compare the routers' view with."},
        "sglang_router_membership_identity": {
            "type": "bool", "default": False,
            "description": "A stop: a router whose secret settings alone are refused is "
                           "reached by its identity, with the admin key it was started with "
                           "(read from its env file on its host)."},
    },
}

ROLE_FILES = RoleFiles(
    table=SETTINGS, section_notes=SECTION_NOTES, role_dir=ROLE_DIR,
    module="sglang_fleet.settings.router",
    intro=("The router in front of the fleet: SGLang's own (sglang-router), its membership "
           "decided",
           "by the gate. meta/argument_specs.yml mirrors this file."),
    short_description="Run SGLang's router (sglang-router) in front of the fleet",
    description=(
        "Validates the router's settings on the controller, installs the pinned release "
        "into its own virtualenv, lets the installed router parse the rendered command, "
        "renders the launch files (secrets in a 0600 env file) and runs it under systemd "
        "or the supervisor, like the servers.",
        "Its task files membership.yml, drain.yml and view.yml put ready servers in, take "
        "failed ones out, drain a worker before a restart and report the router's view."),
    entry_points=(("membership", MEMBERSHIP_ENTRY),))


if __name__ == "__main__":
    sys.exit(ROLE_FILES.main())
