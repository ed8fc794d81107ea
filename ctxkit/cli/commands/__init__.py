"""One module per `ctxkit` subcommand (thin: parse, call the library, print)."""
