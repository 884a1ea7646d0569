"""One module per ``python -m kvprof`` subcommand (see kvprof/cli.py for the contract)."""
