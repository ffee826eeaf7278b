"""A local worker whose contract is refused answered its hello: the error says why it is
refused and nothing more, not that the worker is "not serving yet: its policy is still
loading" (said only when the hello went unanswered: tests/test_local_hello.py). The real
daemon with a real local worker whose policy answers at 5 Hz against a 30 Hz robot."""

from __future__ import annotations

import re
from pathlib import Path

from tests.daemon_util import Daemon

NOT_SERVING = "not serving yet"


def test_a_refused_contract_is_not_called_a_worker_still_loading(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "--set", "policy.args.hz=5", "--duration", "20")
    assert d.wait_exit(timeout=90) == 2
    log = "".join(d.wait_eof())
    where = re.escape(f"policy worker at stream+ipc://{d.dir}/worker-")
    (line,) = [ln for ln in log.splitlines() if re.search(where + r"\w+\.sock: actions.hz", ln)]
    assert line.endswith(
        "actions.hz 5 against a control rate of 30 Hz would stretch a chunk more than 4-fold"
    ), line  # and no tail after it
    assert NOT_SERVING not in log, log[-3000:]
