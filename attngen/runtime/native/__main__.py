"""`python -m attngen.runtime.native`: build the native training step into the cache (see __init__)."""
import sys

from . import main

sys.exit(main())
