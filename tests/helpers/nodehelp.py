"""Node agents started as a person would start them: the join command the notebook printed, run as it is."""

from __future__ import annotations

import re
import subprocess
import sys

JOIN = re.compile(r"python -m nbtrain\.node --join \S+ --token-file \S+")


def join_command(text: str) -> str:
    """The join command in what a cell printed (it names the token's 0600 file, never the token)."""
    found = JOIN.search(text)
    assert found, text
    return found.group(0)


def start_agent(command: str, address: str, prefix=()) -> subprocess.Popen:
    """Run ``command`` (``python -m nbtrain.node --join … --token-file …``) from ``address``; ``prefix`` runs it
    through another command (``ip netns exec NAME``, which execs it: the pid is the agent's)."""
    args = command.split()[1:]
    return subprocess.Popen([*prefix, sys.executable, *args, "--address", address],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
