import sys

from testbed.cli.main import main

sys.exit(main())
