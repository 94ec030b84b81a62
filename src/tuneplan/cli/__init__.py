"""The command line (a face): Typer app, one module per command group."""
