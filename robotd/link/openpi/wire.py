"""What one websockets connection to an openpi server says, in the link's terms: frames it
holds unread, closing it at once, and what a text frame or a close means (the link's
errors, robotd.link.openpi.errors). No state; used by robotd.link.openpi.client.

Everything here reads what the server sent, so every text is bounded: a traceback at
MAX_SERVER_TEXT characters, a line quoted in a message at 300, a close reason at 200.
"""

from __future__ import annotations

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from robotd.link.openpi.errors import ConnectionLost, OpenpiError, ServerError

MAX_SERVER_TEXT = 64 << 10  # characters of a server's traceback kept
INTERNAL_ERROR = 1011


def pending_frames(conn: ClientConnection) -> int:
    """Frames received and not yet read (websockets' assembler queue; 0 if it moved)."""
    frames = getattr(getattr(conn, "recv_messages", None), "frames", None)
    try:
        return len(frames) if frames is not None else 0
    except TypeError:
        return 0


def abort(conn: ClientConnection) -> None:
    """Close at once, without a closing handshake: nothing more is read from it."""
    transport = getattr(conn, "transport", None)
    if transport is not None:
        transport.abort()


def server_text(text: str, when: str) -> ServerError:
    """A text frame from the server (openpi sends its policy's traceback so) as the error."""
    kept = text[:MAX_SERVER_TEXT]
    last = next((ln for ln in reversed(kept.strip().splitlines()) if ln.strip()), "")
    return ServerError(f"server error {when}: {last[:300] or '(empty text frame)'}", kept)


def closed_error(exc: ConnectionClosed, when: str) -> ServerError | ConnectionLost:
    """A closed connection as the error: ServerError for openpi's 1011 (its policy
    failed), ConnectionLost for any other close, with its code and reason."""
    rcvd = exc.rcvd
    if rcvd is not None and rcvd.code == INTERNAL_ERROR:
        reason = rcvd.reason[:MAX_SERVER_TEXT]
        return ServerError(
            f"server closed with 1011 (internal error) {when}: {reason[:300]}", reason, 1011
        )
    if rcvd is not None:
        how = f"code {rcvd.code} {rcvd.reason[:200]!r}"
    elif exc.sent is not None:  # e.g. 1009: the server's frame was over max_reply_bytes
        how = f"closed by robotd: code {exc.sent.code} {exc.sent.reason[:200]!r}"
    else:
        how = "no close frame"
    return ConnectionLost(f"connection closed {when} ({how})")


def describe(exc: BaseException) -> str:
    """A failed connection attempt in words (at most 500 characters)."""
    if isinstance(exc, OpenpiError):
        return exc.message
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):
            return f"the server refused the API key (HTTP {status})"
        return f"the handshake was refused (HTTP {status})"
    if isinstance(exc, TimeoutError):
        return "no connection and metadata within the connect timeout"
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]
