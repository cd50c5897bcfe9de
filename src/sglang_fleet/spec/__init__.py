"""The LaunchSpec and what it is made of: the settings tables and their kinds, one host's
problems, SGLang's own post-parse checks, prefill/decode rules, clashes between servers, the
secrets registry, the launch files rendered, the role files generated from the tables, and the
modules' views of the spec (action)."""
