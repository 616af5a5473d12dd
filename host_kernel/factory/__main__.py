"""``python -m host_kernel.factory``: run the kernel factory (see ``_server``)."""

import sys

from ._server import main

sys.exit(main())
