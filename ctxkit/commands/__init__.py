"""One module per `ctxkit` subcommand (L5, thin: parse, call the library, print)."""
