"""STS packets (checksum ~sum & 0xFF), the streaming parser, sign-magnitude registers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drivers.feetech import packet as p
from drivers.feetech import table as t
from drivers.feetech.driver import FeetechJoints, word
from drivers.servo.frames import Corrupt, Frame

H = bytes.fromhex


def test_checksum_is_the_inverted_low_byte_of_the_sum():
    # read 2 bytes of Present Position (56) from servo 1: 1 + 4 + 2 + 56 + 2 = 65 → ~65 = 0xBE
    assert p.read(1, 56, 2) == H("FF FF 01 04 02 38 02 BE")
    assert p.ping(1) == H("FF FF 01 02 01 FB")
    # a sum over 255 keeps its low byte only
    pkt = p.write(0xFD, 0xFF, b"\xff\xff")
    assert pkt[-1] == ~sum(pkt[2:-1]) & 0xFF


def test_sync_read_and_write_layout():
    assert p.sync_read(56, 6, [1, 2, 3]) == H("FF FF FE 07 82 38 06 01 02 03") + bytes(
        (~(0xFE + 7 + 0x82 + 56 + 6 + 1 + 2 + 3) & 0xFF,)
    )
    pkt = p.sync_write(42, 2, [(1, b"\x00\x08"), (2, b"\xff\x07")])
    assert pkt[:7] == H("FF FF FE 0A 83 2A 02") and pkt[7:-1] == H("01 00 08 02 FF 07")


@given(st.integers(0, 252), st.integers(0, 255), st.binary(max_size=120), st.integers(1, 9))
def test_any_packet_survives_the_parser_in_any_chunking(ident, head, params, chunk):
    pkt = p.packet(ident, head, params)
    parser = p.PacketParser()
    frames = []
    for i in range(0, len(pkt), chunk):
        frames += parser.feed(pkt[i : i + chunk])
    assert frames == [Frame(ident, head, params, pkt)]


def test_parser_resyncs_after_a_bad_checksum_and_ff_runs():
    good = p.status_packet(2, 0, b"\xff\xff\x10")  # FF FF inside data: no false header
    bad = bytearray(p.status_packet(1, 0, b"\x05"))
    bad[-1] ^= 1
    out = p.PacketParser().feed(b"\xff\xff\xff" + bytes(bad) + good)
    assert [f.ident for f in out if isinstance(f, Frame)] == [2]
    assert [f.params for f in out if isinstance(f, Frame)] == [b"\xff\xff\x10"]
    assert any(isinstance(f, Corrupt) and f.ident == 1 for f in out)


@given(st.binary(max_size=400))
def test_parser_never_raises_on_noise(noise):
    parser = p.PacketParser()
    out = parser.feed(noise)
    assert all(isinstance(f, Frame | Corrupt) for f in out)


@pytest.mark.parametrize(
    ("raw", "bit", "value"),
    [
        (0x0000, 15, 0),
        (0x07FF, 15, 2047),
        (0x8001, 15, -1),
        (0x8FA0, 15, -4000),
        (0x0800, 11, -0),
        (0x0801, 11, -1),
        (0x07FF, 11, 2047),
        (0x0FFF, 11, -2047),
        (0x0400 | 5, 10, -5),
        (0xF001, 11, 1),  # bits above the sign are not part of the value
    ],
)
def test_sign_magnitude_decoding(raw, bit, value):
    assert t.decode_sign_magnitude(raw, bit) == value


@given(st.integers(-2047, 2047))
def test_homing_offset_round_trip(value):
    raw = t.encode_sign_magnitude(value, 11)
    assert raw < 1 << 12
    assert t.decode_sign_magnitude(raw, 11) == value


def test_sign_magnitude_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        t.encode_sign_magnitude(2048, 11)


def test_state_block_decodes_negative_velocity_and_load():
    block = word(2100, 15) + word(-300, 15) + (0x0400 | 120).to_bytes(2, "little")
    assert FeetechJoints.decode_state(None, block) == (2100, -300, -120)  # type: ignore[arg-type]
