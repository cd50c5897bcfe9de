"""The settings tables, below everything that reads them: one table per role (server: the
`sglang_server_*` settings, router: the `sglang_router_*` settings), the kinds their rows are
made of, the collector of one host's problems, the role files generated from a table, the
secrets registry derived from both tables, and what a mapping given with -e replaces."""
