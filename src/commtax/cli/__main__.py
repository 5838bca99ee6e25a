"""``python -m commtax.cli``: the command line."""

from commtax.cli.main import main

if __name__ == "__main__":
    main()
