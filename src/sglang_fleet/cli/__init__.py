"""The `sglang-fleet` command line: main (the parser and dispatch), one module per command,
common (the run folder and one playbook run), inputs (the inventory and -e checked before
Ansible starts), trials (what sweep and bisect share)."""
