"""`python -m portkit`: the same command line as `portkit`."""
import sys

from portkit.cli import main

sys.exit(main())
