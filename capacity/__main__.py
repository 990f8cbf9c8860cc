"""`python -m capacity [flags]`: the planner without the gateway (same flags as `llm-gateway plan`)."""

from __future__ import annotations

import argparse
import sys

from capacity.cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process arguments) and run the planner."""
    parser = argparse.ArgumentParser(prog="python -m capacity", description="Offline GPU capacity planner.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
