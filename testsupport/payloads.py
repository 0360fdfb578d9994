"""Large request bodies and process memory readings, for the tests and the benchmark
of the model server's body limits."""

from __future__ import annotations

from pathlib import Path

MiB = 1 << 20


def v2_body(item: bytes, size: int, width: int) -> bytes:
    """An OIP v2 request of about `size` bytes: one FP32 input [rows, width] whose flat
    data repeats `item` (`b"1,"`, `b"0.1234567,"`)."""
    count = size // len(item)
    count -= count % width
    data = (item * count)[:-1]
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,%d],"data":[' % (count // width, width)
    return head + data + b"]}]}"


def nested_body(item: bytes, size: int, width: int) -> bytes:
    """An OIP v2 request of about `size` bytes with nested rows of `width` values."""
    row = b"[" + b",".join([item] * width) + b"]"
    rows = max(1, size // (len(row) + 1))
    data = b",".join([row] * rows)
    return b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,%d],"data":[%s]}]}' % (rows, width, data)


def lists_body(size: int, width: int) -> bytes:
    """A valid request that carries `size` bytes of empty lists in its parameters."""
    lists = b"[]," * (size // 3 - 1) + b"[]"
    ones = b",".join([b"1"] * width)
    return b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,%d],"data":[%s],"parameters":{"p":[%s]}}]}' % (
        width,
        ones,
        lists,
    )


def http_post(path: str, body: bytes) -> bytes:
    """The raw HTTP/1.1 request, for clients on plain sockets."""
    head = b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (path.encode(), len(body)) + body


def memory(pid: int, key: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no {key} for process {pid}")


def reset_peak(pid: int) -> None:
    """Make VmHWM start again from VmRSS (Linux; needs the right to write clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
