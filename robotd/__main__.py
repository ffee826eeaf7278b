import sys

from robotd.cli import main

sys.exit(main())
