"""``python -m commtax.cli``: the command line."""

from commtax.cli.entry import main

if __name__ == "__main__":
    main()
