"""Entry point of a rank process: ``python -m nbtrain.worker`` (started by the kernel, never by hand)."""

from .main import main

if __name__ == "__main__":
    main()
