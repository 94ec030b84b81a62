"""``python -m tuneplan``: the same command line as the ``tuneplan`` script."""

from tuneplan.cli.app import main

if __name__ == "__main__":
    main()
