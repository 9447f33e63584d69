"""Entry point of a rank process: ``python -m nbtrain.rank`` (started by the kernel, never by hand).

The stop button's SIGINT is deferred before anything else — above all before ``import torch`` — so a
stop while the rank starts ends it quietly instead of with an import traceback (see :mod:`.stop`).
"""

from . import stop

if __name__ == "__main__":
    stop.install()
    import time

    launched = time.time()  # the cold start's split counts the imports from here

    from .main import main

    main(launched)
