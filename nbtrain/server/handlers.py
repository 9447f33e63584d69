"""The HTTP routes of nbtrain's server extension (all JSON, all under the server's base_url).

* ``GET  /nbtrain/gpus``      — each GPU's utilisation, memory and processes; CPU and RAM (see ``gpus.py``)
* ``GET  /nbtrain/runs``      — nbtrain runs of this server's kernels, with notebook path, ranks, step, loss
* ``GET  /nbtrain/processes`` — the GPU processes, each with the kernel and notebook it belongs to
* ``POST /nbtrain/stop``      — body ``{"kernel_id": "…"}`` or ``{"pid": 123}``: interrupt the kernel whose
  nbtrain run that is. 202 when sent; 404 when it names no run of this server; 409 when the run is over.
* ``POST /nbtrain/detached/stop`` — body ``{"run_id": "…"}``: stop one of this user's detached runs (``--detach``),
  through its agent. 202 when asked; 400 for no run id; 404 when there is no such run of this user's; 409 when it
  has ended (``GET /nbtrain/runs`` lists them under ``detached``).
* ``POST /nbtrain/leases/release`` — body ``{"gpu": 0}``: give back a GPU this user's idle warm ranks lease (their
  kernel runs ``%distributed_shutdown``). 200 when done; 404 when no lease of this user's is on it; 409 when a
  cell runs on it, or a process this server did not start holds it.

Every route needs the server's authentication (token or cookie); without it the answer is 403. Each
handler method is ``@tornado.web.authenticated`` and ``@authorized`` (resource ``kernels``), and every path in
:data:`ROUTES` is joined to the server's base_url. The JSON shapes are written down for the browser in
``labextension/src/types.ts``; tests/test_lab_contract.py checks the two agree.
"""

from __future__ import annotations

import json

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .lease_rows import ReleaseRefused
from .runs import StopRefused


class _NbtrainHandler(APIHandler):
    # Reading these routes is reading kernels; stopping a run is acting on a kernel.
    auth_resource = "kernels"

    @property
    def service(self):
        return self.settings["nbtrain"]

    async def answer(self, work, status: int = 200) -> None:
        """Finish with what ``work`` (a coroutine) returns, or with a refusal's status and message. A refusal is
        answered here rather than raised: its message may hold a notebook path, and tornado would read a "%" in
        it as a format directive when logging an HTTPError."""
        try:
            result = await work
        except (StopRefused, ReleaseRefused) as refused:
            self.set_status(refused.status)
            self.finish(json.dumps({"message": refused.message}))
            return
        self.set_status(status)
        self.finish(json.dumps(result))


class GpusHandler(_NbtrainHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps(await self.service.gpus()))


class RunsHandler(_NbtrainHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps(await self.service.runs()))


class ProcessesHandler(_NbtrainHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps(await self.service.processes()))


class StopHandler(_NbtrainHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self):
        body = self.get_json_body()
        kernel_id, pid = (body.get("kernel_id"), body.get("pid")) if isinstance(body, dict) else (None, None)
        valid_pid = isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
        if not (isinstance(kernel_id, str) and kernel_id) and not valid_pid:
            raise tornado.web.HTTPError(400, 'send {"kernel_id": "<kernel id>"} or {"pid": <process id>}')
        await self.answer(self.service.stop(kernel_id=kernel_id or None, pid=None if kernel_id else pid), 202)


class ReleaseHandler(_NbtrainHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self):
        body = self.get_json_body()
        gpu = body.get("gpu") if isinstance(body, dict) else None
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise tornado.web.HTTPError(400, 'send {"gpu": <GPU index>}')
        await self.answer(self.service.release_gpu(gpu))


class DetachedStopHandler(_NbtrainHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self):
        body = self.get_json_body()
        await self.answer(self.service.stop_detached(body.get("run_id") if isinstance(body, dict) else None), 202)


# Path under <base_url>/nbtrain/ -> handler.
ROUTES = {"gpus": GpusHandler, "runs": RunsHandler, "processes": ProcessesHandler, "stop": StopHandler,
          "leases/release": ReleaseHandler, "detached/stop": DetachedStopHandler}


def setup_handlers(web_app) -> None:
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base_url, "nbtrain", path), handler)
                                 for path, handler in ROUTES.items()])
