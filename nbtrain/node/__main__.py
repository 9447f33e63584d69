"""``python -m nbtrain.node``: see :mod:`nbtrain.node.main`."""

from .main import main

if __name__ == "__main__":
    main()
