"""The errors of the openpi link, one class per thing the daemon does differently.

`OpenpiLink.act` raises exactly one of ActTimeout, ServerError, ConnectionLost or BadReply
for anything that goes wrong on the wire (and CodecError, before anything is sent, for a
request that cannot be encoded: a robot-side bug). `request.parse_reply` raises BadReply.
Every message names what was wrong and where; none carries the API key.
"""

from __future__ import annotations


class CodecError(ValueError):
    """Bytes that are not a valid openpi message, or an object that cannot be encoded.
    The message names the problem and where in the message it is (e.g. `at actions`)."""


class RequestError(ValueError):
    """The robot's observation does not fit the configured mapping (a missing key, a joint
    index past the robot's joints, a frame that is not an image): named by input."""


class OpenpiError(Exception):
    """Something went wrong talking to the openpi server; `message` says what."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ActTimeout(OpenpiError, TimeoutError):
    """No reply within the act's timeout. The connection was closed, so a late reply is
    never read as the answer to a later request; reconnect before the next act."""


class ServerError(OpenpiError):
    """The server failed the request: a text frame (openpi sends the policy's traceback)
    or a close with code 1011. `text` holds the server's text (bounded), `code` the close
    code when there was one. The connection is gone: reconnect, reset the episode."""

    def __init__(self, message: str, text: str, code: int | None = None) -> None:
        super().__init__(message)
        self.text = text
        self.code = code


class ConnectionLost(OpenpiError, ConnectionError):
    """The link has no connection (lost, never made, refused, or the link was closed).
    Reconnect with `connect()`, then reset the episode as for a lost one."""


class BadReply(OpenpiError, ValueError):
    """A reply that breaks the protocol or the configured action mapping; the message
    names the field. The connection stays up (one reply was consumed for one request)."""
