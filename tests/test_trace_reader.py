"""The reader on damaged files: a file cut at any byte reads back exactly the messages of
its whole chunks and says it was torn; damage inside a chunk is caught by its CRC; bytes
that are no MCAP are refused. Never a misread message."""

from __future__ import annotations

import shutil
import struct

import pytest
from mcap.data_stream import ReadDataStream
from mcap.reader import make_reader
from mcap.records import Chunk
from mcap.stream_reader import breakup_chunk
from trace_util import CONFIG, only_run, tick

from robotd.trace.reader import TraceError, TraceReader, read_all
from robotd.trace.store import TraceStore


def _episode(tmp_path, n=24, flush_bytes=700):
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG, flush_bytes=flush_bytes, fsync=False)
    ep = store.begin_episode(1, "w1", "task")
    for s in range(n):
        ep.write("/robot/tick", 10_000 + s, tick(s))
    ep.end("stopped")
    store.close()
    return only_run(tmp_path / "runs") / "episode-000001.mcap"


def _layout(path):
    """Record ends (byte offsets) and, per chunk end, how many messages precede it."""
    data = path.read_bytes()
    ends, pos, footer_end = {8}, 8, None
    while pos < len(data) - 8:
        op, length = struct.unpack_from("<BQ", data, pos)
        pos += 9 + length
        if op == 0x02:
            footer_end = pos
        else:
            ends.add(pos)
    with open(path, "rb") as f:
        summary = make_reader(f).get_summary()
        cum, chunk_ends = 0, []
        for ci in summary.chunk_indexes:
            f.seek(ci.chunk_start_offset + 9)
            chunk = Chunk.read(ReadDataStream(f))
            cum += sum(type(r).__name__ == "Message" for r in breakup_chunk(chunk))
            chunk_ends.append((ci.chunk_start_offset + ci.chunk_length, cum))
    return data, ends, footer_end, chunk_ends


def test_cut_at_every_byte_reads_whole_chunks_and_says_so(tmp_path):
    path = _episode(tmp_path, n=8, flush_bytes=500)
    full, _ = read_all(path)
    data, ends, _, chunk_ends = _layout(path)
    assert len(chunk_ends) >= 3
    cut = tmp_path / "cut.mcap"
    shutil.copy(path, cut)
    for length in range(len(data) - 1, 7, -1):
        with open(cut, "r+b") as f:
            f.truncate(length)
        reader = TraceReader(cut)
        got = list(reader.messages())
        want = max([n for end, n in chunk_ends if end <= length], default=0)
        assert got == full[:want], length
        st = reader.status
        assert not st.complete and st.offset <= length
        assert st.torn == (length not in ends), length
        assert f"recovered {want} " in st.message if st.torn else f"all {want} " in st.message
    cut.write_bytes(data[:5])
    with pytest.raises(TraceError, match="not an MCAP"):
        list(TraceReader(cut).messages())


def test_a_flipped_byte_inside_a_chunk_fails_its_crc(tmp_path):
    path = _episode(tmp_path)
    full, _ = read_all(path)
    data, _, _, chunk_ends = _layout(path)
    (second_start, _), (second_end, _) = chunk_ends[0], chunk_ends[1]
    broken = bytearray(data)
    broken[second_end - 10] ^= 0x40  # inside the second chunk's compressed data
    path.write_bytes(bytes(broken))
    reader = TraceReader(path)
    got = list(reader.messages())
    assert got == full[: chunk_ends[0][1]]  # the first chunk only; nothing after the damage
    assert reader.status.torn
    assert "CRC" in reader.status.damage or "decompress" in reader.status.damage
    assert second_start < second_end


def test_zeros_and_garbage_after_the_data_stop_the_read(tmp_path):
    path = _episode(tmp_path)
    full, _ = read_all(path)
    data, _, _, chunk_ends = _layout(path)
    last_chunk_end, n = chunk_ends[-1]
    for tail in (b"\0" * 4096, b"\x06" + struct.pack("<Q", 10**12), b"\x06" + b"\xff" * 40):
        path.write_bytes(data[:last_chunk_end] + tail)
        reader = TraceReader(path)
        assert list(reader.messages()) == full[:n]
        assert reader.status.torn and reader.status.offset == last_chunk_end


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="No such file"):
        list(TraceReader(tmp_path / "none.mcap").messages())


def test_any_damaged_byte_never_yields_a_wrong_message(tmp_path):
    """Flip one byte anywhere, 400 times: what comes back is a prefix of the real messages
    (never a changed one, never one from beyond a hole), and nothing but TraceError raises."""
    import random

    path = _episode(tmp_path, n=40, flush_bytes=900)
    full, _ = read_all(path)
    data = path.read_bytes()
    rng = random.Random(3)
    bad = tmp_path / "bad.mcap"
    for _ in range(400):
        pos = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        reader = TraceReader(bad)
        try:
            got = list(reader.messages())
        except TraceError:
            assert pos < 8  # only a damaged magic is refused outright
            continue
        assert got == full[: len(got)], pos
        assert reader.status.gaps == 0, pos


def test_a_damaged_opcode_byte_never_passes_over_a_chunk(tmp_path):
    """No CRC covers a record's opcode: a chunk's, changed into another record's, must
    still be read as the chunk it is (its CRC says so) or end the scan, never be passed
    over with the chunks after it read as if nothing were missing. Every bit of every
    record's opcode, flipped (a file's layout varies with its metadata: this covers all)."""
    path = _episode(tmp_path, n=40, flush_bytes=900)
    full, _ = read_all(path)
    data, ends, _footer, _chunks = _layout(path)
    starts = sorted(e for e in ends if e < len(data) - 8)
    bad = tmp_path / "bad.mcap"
    for pos in starts:
        for bit in range(8):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            bad.write_bytes(bytes(flipped))
            reader = TraceReader(bad)
            got = list(reader.messages())
            assert got == full[: len(got)], (pos, bit)
            assert reader.status.gaps == 0, (pos, bit, reader.status.message)
            if data[pos] == 0x06:  # a chunk: recovered whole, or the scan stopped there
                assert len(got) == len(full) or reader.status.torn, (pos, bit)


def test_a_read_of_some_topics_counts_every_whole_message_all_the_same(tmp_path):
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG, fsync=False)
    ep = store.begin_episode(1, "w1", "task")
    for s in range(10):
        ep.write("/robot/tick", 10_000 + s, tick(s))
        ep.write("/policy/ask", 10_001 + s, {"id": s, "wep": "w1", "s": s, "queue": 0,
                                             "delay": 0})
    ep.end("stopped")
    store.close()
    path = only_run(tmp_path / "runs") / "episode-000001.mcap"
    every = TraceReader(path)
    n = len(list(every.messages()))
    ticks = TraceReader(path)
    assert len(list(ticks.messages(["/robot/tick"]))) == 10
    assert ticks.status.messages == every.status.messages == n  # trace ls and replay agree
