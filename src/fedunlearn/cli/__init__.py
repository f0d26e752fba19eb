"""Command-line interface (typer): thin commands over library functions."""
