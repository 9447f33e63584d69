"""nbtrain's Jupyter server extension: GPU, run and process routes behind the JupyterLab panel.

Enabled by installing nbtrain (``pip install .`` puts ``etc/jupyter/jupyter_server_config.d/nbtrain.json``
in the environment); ``jupyter server extension list`` shows it as ``nbtrain.server``. To turn it off:
``jupyter server extension disable nbtrain.server``.

The routes are described in :mod:`nbtrain.server.handlers`. They read the run records that kernels running
``%%distributed`` write (:mod:`nbtrain.launch.observers.registry`), join them with the server's own kernels and
sessions to name the notebook, and stop a run only by interrupting a kernel this server manages.
"""

from __future__ import annotations


def _jupyter_server_extension_points():
    return [{"module": "nbtrain.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .gpus import prime_cpu
    from .handlers import setup_handlers
    from .service import NbtrainService

    service = NbtrainService(serverapp.kernel_manager, serverapp.session_manager)
    serverapp.web_app.settings["nbtrain"] = service
    setup_handlers(serverapp.web_app)
    prime_cpu()
    serverapp.log.info("nbtrain: GPU and run routes at %snbtrain/ (runs read from %s)", serverapp.base_url,
                       service.runs_directory)
