"""The ``commtax`` command: every command a thin typer layer over a library function (``main.COMMANDS``)."""
