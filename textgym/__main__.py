"""`python -m textgym` runs the command line."""

from textgym.cli import main

main()
