"""`robotd serve` says what is wrong with an endpoint it cannot bind (no scheme, a scheme it
does not serve: naming it and the ones it does), before it starts any copy of the policy.
Real `robotd serve` processes."""

from __future__ import annotations

import pytest

from tests.copy_util import serve_fails

ACCEPTED = "accepted: tcp://HOST:PORT, ipc://PATH, stream+tcp://HOST:PORT, stream+ipc://PATH"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--bind", "127.0.0.1:57560"], "--bind '127.0.0.1:57560': no scheme; " + ACCEPTED),
        (
            ["--bind", "http://127.0.0.1:57560"],
            "--bind 'http://127.0.0.1:57560': scheme 'http' is not served; " + ACCEPTED,
        ),
        (["--bind", "tcp://127.0.0.1"], "--bind 'tcp://127.0.0.1': want tcp://HOST:PORT"),
        (
            ["--observe", "http://127.0.0.1:57561"],
            "--observe 'http://127.0.0.1:57561': scheme 'http' is not served; "
            "accepted: tcp://HOST:PORT, ipc://PATH, inproc://NAME",
        ),
        (["--observe", "stream+ipc:///tmp/o.sock"], "scheme 'stream+ipc' is not served"),
    ],
)
def test_a_bad_endpoint_is_named_before_any_copy_starts(flags: list[str], said: str) -> None:
    code, out = serve_fails("answer_policies:Answers", "--copies", "1", *flags)
    assert code == 2, out
    assert said in out, out
    assert "cannot derive" not in out
    assert "copy 1" not in out and "listening" not in out, out  # nothing was started
    assert "Traceback" not in out
