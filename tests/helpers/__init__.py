"""What the tests share, one of each (imported as ``helpers.*``: pyproject puts ``tests`` on pytest's path).

- ``runhelp``: ``run_cell``, the one way a test runs a cell on real ranks, and ``Captured`` for its output.
- ``workers``: finding the rank processes this test run started (the leftover checks of conftest).
- ``kernelhelp`` / ``serverhelp``: a real Jupyter kernel, driven directly or through a test Jupyter server.
- ``outputs``: what an iopub message or a saved notebook output shows, as text.
- ``fake_nvml``: the stand-in ``pynvml`` for machines without an NVIDIA GPU (the only stand-in the tests use).
- ``labhelp`` / ``tsinterfaces``: JupyterLab in a headless browser; the TypeScript interfaces of the extension.
- ``chartbuild``: the dashboard chart's JavaScript bundle, rebuilt when its sources are newer.
"""
