"""`python -m pystatestore.worker`: the state worker process the JVM shim starts."""

import sys

from .process import main

sys.exit(main())
