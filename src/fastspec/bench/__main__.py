import sys

from fastspec.bench.cli import main

sys.exit(main())
