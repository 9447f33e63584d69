"""nbtrain's Jupyter server extension: GPU, run and process routes behind the JupyterLab panel.

Enabled by installing nbtrain (``pip install .`` puts ``etc/jupyter/jupyter_server_config.d/nbtrain.json``
in the environment); ``jupyter server extension list`` shows it as ``nbtrain.server``. To turn it off:
``jupyter server extension disable nbtrain.server``.

The routes are described in :mod:`nbtrain.server.handlers`. They read the run records that kernels running
``%%distributed`` write (:mod:`nbtrain.kernel.observers.registry`), join them with the server's own kernels and
sessions to name the notebook, and stop a run only by interrupting a kernel this server manages.
"""

from __future__ import annotations


def _jupyter_server_extension_points():
    return [{"module": "nbtrain.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .gpus import prime_cpu
    from .handlers import setup_handlers
    from .service import NbtrainService

    service = NbtrainService(serverapp.kernel_manager, serverapp.session_manager, root_dir=serverapp.root_dir)
    serverapp.web_app.settings["nbtrain"] = service
    setup_handlers(serverapp.web_app)
    untrack_subshell_requests(serverapp)
    prime_cpu()
    serverapp.log.info("nbtrain: GPU and run routes at %snbtrain/ (runs read from %s)", serverapp.base_url,
                       service.runs_directory)


# JupyterLab 4.4 opens a kernel subshell for the widgets' comms (comms over subshells) when a dashboard appears, and
# nbtrain's extension one for a reloaded page's dashboard; each subshell request's status messages ("busy", then
# "idle") would set the notebook's kernel indicator to Idle while the cell still runs. Like kernel_info, they are
# no activity of the user's: untracked, so the page leaves its kernel status to the cell's own messages.
SUBSHELL_MESSAGES = ("create_subshell_request", "create_subshell_reply", "delete_subshell_request",
                     "delete_subshell_reply", "list_subshell_request", "list_subshell_reply")


def untrack_subshell_requests(serverapp) -> None:
    """Add :data:`SUBSHELL_MESSAGES` to the server's untracked message types and to the page's copy of them."""
    manager = serverapp.kernel_manager
    known = list(getattr(manager, "untracked_message_types", ()) or ())
    untracked = known + [kind for kind in SUBSHELL_MESSAGES if kind not in known]
    manager.untracked_message_types = untracked
    page = serverapp.web_app.settings.get("page_config_data")
    if page is not None and "untracked_message_types" in page:  # JupyterLab copied the list before this ran
        page["untracked_message_types"] = list(untracked)
