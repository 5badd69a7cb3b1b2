#!/usr/bin/env python3
"""fcgi_stop_race.py SOCKET PID [URI] - a stop that comes between a
connection's accept and its request's first bytes.

Connects to the FastCGI unix socket SOCKET, waits until process PID (a
worker alone on the socket, as spawn-fcgi -F 1 leaves it) has accepted the
connection (one more descriptor in /proc/PID/fd), sends PID SIGTERM, waits a
little, then sends a GET of URI (/market/health) as a web server would, and
prints the answer's Status line, or NO_ANSWER when the connection was
closed before an answer (what nginx turns into 502). Exit status 0 when it
printed an answer's status."""

import os
import signal
import socket
import struct
import sys
import time


def record(rtype, body):
    return struct.pack(">BBHHBx", 1, rtype, 1, len(body), 0) + body


def pair(name, value):
    out = b""
    for s in (name, value):
        n = len(s)
        out += bytes([n]) if n < 128 else struct.pack(">I", n | 0x80000000)
    return out + name + value


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def main():
    path, pid = sys.argv[1], int(sys.argv[2])
    uri = sys.argv[3] if len(sys.argv) > 3 else "/market/health"
    before = fds(pid)
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    deadline = time.monotonic() + 10
    while fds(pid) <= before:
        if time.monotonic() > deadline:
            print("NOT_ACCEPTED")
            return 2
        time.sleep(0.01)
    os.kill(pid, signal.SIGTERM)
    # Long enough for a worker that drops the connection at the stop to have
    # done so; the answer then tells whether it did.
    time.sleep(0.3)
    params = b"".join(pair(k.encode(), v.encode()) for k, v in (
        ("REQUEST_METHOD", "GET"), ("REQUEST_URI", uri), ("SCRIPT_NAME", uri),
        ("QUERY_STRING", ""), ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("GATEWAY_INTERFACE", "CGI/1.1"), ("REMOTE_ADDR", "127.0.0.1"),
        ("SERVER_NAME", "localhost"), ("CONTENT_LENGTH", "0")))
    req = (record(1, struct.pack(">HB5x", 1, 0)) + record(4, params) + record(4, b"")
           + record(5, b""))
    data = b""
    try:
        s.sendall(req)
        s.settimeout(10)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    out, i = b"", 0
    while i + 8 <= len(data):
        _v, rtype, _id, clen, plen = struct.unpack(">BBHHBx", data[i:i + 8])
        if rtype == 6:
            out += data[i + 8:i + 8 + clen]
        i += 8 + clen + plen
    for line in out.split(b"\r\n"):
        if line.lower().startswith(b"status:"):
            print(line.decode().split(":", 1)[1].strip().split()[0])
            return 0
    if out:
        print("200")
        return 0
    print("NO_ANSWER")
    return 1


if __name__ == "__main__":
    sys.exit(main())
