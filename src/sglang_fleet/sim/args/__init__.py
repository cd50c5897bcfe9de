"""The simulator's parse of a command line, as SGLang's own server_args and config file."""
