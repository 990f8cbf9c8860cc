"""`python -m cli …`: the `llm-gateway` command without the installed entry point."""

from cli.main import main

raise SystemExit(main())
