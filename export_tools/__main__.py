import sys

from export_tools.cli import main

sys.exit(main())
