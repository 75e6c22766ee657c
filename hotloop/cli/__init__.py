"""Command line: ``hotloop serve / chat / check_env / bench``."""
