#!/usr/bin/env python3
"""fcgi_stop_race.py [--kept] SOCKET PID [URI] - a worker told to stop while
a web server's request is on its way to it.

PID is a worker alone on the FastCGI unix socket SOCKET (as spawn-fcgi -F 1
leaves it). Without --kept: connects, waits until PID has accepted the
connection (one more descriptor in /proc/PID/fd), sends PID SIGTERM, waits a
little, then sends a GET of URI (/market/health) as a web server would.
With --kept: sends a first GET on a connection the web server keeps
(FCGI_KEEP_CONN, as nginx's fastcgi_keep_conn), reads its answer, sends PID
SIGTERM, waits a little, then sends a second GET on the same connection.
Prints the (last) answer's status, or NO_ANSWER when the connection was
closed first (what nginx turns into 502, and does not send again for a
POST). Exit status 0 when it printed a status."""

import os
import signal
import socket
import struct
import sys
import time


def record(rtype, body, rid=1):
    return struct.pack(">BBHHBx", 1, rtype, rid, len(body), 0) + body


def pair(name, value):
    out = b""
    for s in (name, value):
        n = len(s)
        out += bytes([n]) if n < 128 else struct.pack(">I", n | 0x80000000)
    return out + name + value


def request(uri, keep):
    params = b"".join(pair(k.encode(), v.encode()) for k, v in (
        ("REQUEST_METHOD", "GET"), ("REQUEST_URI", uri), ("SCRIPT_NAME", uri),
        ("QUERY_STRING", ""), ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("GATEWAY_INTERFACE", "CGI/1.1"), ("REMOTE_ADDR", "127.0.0.1"),
        ("SERVER_NAME", "localhost"), ("CONTENT_LENGTH", "0")))
    return (record(1, struct.pack(">HB5x", 1, 1 if keep else 0)) + record(4, params)
            + record(4, b"") + record(5, b""))


def answer(s):
    """The status of the answer read from s up to its END_REQUEST, or None
    when the connection ended first."""
    data, out = b"", b""
    try:
        s.settimeout(10)
        while True:
            while len(data) >= 8:
                _v, rtype, _id, clen, plen = struct.unpack(">BBHHBx", data[:8])
                if len(data) < 8 + clen + plen:
                    break
                body, data = data[8:8 + clen], data[8 + clen + plen:]
                if rtype == 6:
                    out += body
                elif rtype == 3:
                    for line in out.split(b"\r\n"):
                        if line.lower().startswith(b"status:"):
                            return line.decode().split(":", 1)[1].strip().split()[0]
                    return "200"
            chunk = s.recv(65536)
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def main():
    args = sys.argv[1:]
    kept = args[:1] == ["--kept"]
    if kept:
        args = args[1:]
    path, pid = args[0], int(args[1])
    uri = args[2] if len(args) > 2 else "/market/health"
    before = fds(pid)
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    if kept:
        s.sendall(request(uri, True))
        if answer(s) is None:
            print("NO_FIRST_ANSWER")
            return 2
    else:
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
    try:
        s.sendall(request(uri, kept))
        status = answer(s)
    except OSError:
        status = None
    s.close()
    print(status or "NO_ANSWER")
    return 0 if status else 1


if __name__ == "__main__":
    sys.exit(main())
