"""One server's launch: the LaunchSpec, everything needed to start one server on one node,
built in one place (spec) from the settings tables, with prefill/decode rules (pd), clashes
between servers of one machine (clashes), the launch files rendered (render), and the
controller side of the modules that take a view of it (action)."""
