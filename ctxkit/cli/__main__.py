"""`python -m ctxkit.cli`: the `ctxkit` command."""

from ctxkit.cli.parser import main

if __name__ == "__main__":
    raise SystemExit(main())
