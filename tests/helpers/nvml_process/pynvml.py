"""``import pynvml`` in a process started with :func:`helpers.fake_nvml.process_env`: the stand-in over the boards
its environment describes (this module puts the stand-in in its own place in ``sys.modules``)."""

import json
import os
import sys

from helpers import fake_nvml

sys.modules[__name__] = fake_nvml.make_module(fake_nvml.from_table(json.loads(os.environ[fake_nvml.TABLE_VARIABLE])))
