"""A minimal RESP2 client (standard library only) for the benchmark driver:
commands, pipelines, and INFO parsing. Not a general-purpose client."""

import socket


class ReplyError(Exception):
    """An error reply from the server."""


def encode(args):
    """One command as RESP bytes; args are str, bytes or int."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, int):
            a = b"%d" % a
        elif isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    """A blocking connection to one server."""

    def __init__(self, port, host="127.0.0.1", timeout=300.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.pos = 0

    def close(self):
        self.sock.close()

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0

    def _line(self):
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = self.buf[self.pos:end]
                self.pos = end + 2
                return line
            self._fill()

    def _bytes(self, n):
        while len(self.buf) - self.pos < n + 2:
            self._fill()
        data = self.buf[self.pos:self.pos + n]
        self.pos += n + 2
        return data

    def read(self):
        """Reads one reply; error replies are returned as ReplyError objects."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return ReplyError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._bytes(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ConnectionError("bad reply line %r" % line)

    def call(self, *args):
        """Runs one command; raises ReplyError on an error reply."""
        self.sock.sendall(encode(args))
        r = self.read()
        if isinstance(r, ReplyError):
            raise r
        return r

    def pipeline(self, commands, batch=1000):
        """Runs many commands, `batch` at a time in flight; returns the replies
        (error replies included as ReplyError objects)."""
        replies = []
        for i in range(0, len(commands), batch):
            chunk = commands[i:i + batch]
            self.sock.sendall(b"".join(encode(c) for c in chunk))
            replies.extend(self.read() for _ in chunk)
        return replies

    def info(self, section):
        """INFO section as a dict of strings."""
        text = self.call("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out
