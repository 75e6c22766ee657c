"""``python -m hotloop`` runs the CLI."""

from hotloop.cli.main import main

if __name__ == "__main__":
    main()
