"""A process that holds a server's door with strangers, as an attacker on the
same host would: IDLE connections that never say a word and SLOW ones that
trickle the first bytes of a handshake, one byte every half second, and
every connection the server closes opened again at once. Prints "holding N"
once all are open, then goes on until its stdin closes.

    stranger_flood.py HOST PORT IDLE SLOW HEX_OF_A_HANDSHAKE
"""
import binascii
import resource
import select
import socket
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])
idle, slow = int(sys.argv[3]), int(sys.argv[4])
handshake = binascii.unhexlify(sys.argv[5])

_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Stranger:
    def __init__(self, slow):
        self.slow = slow
        self.open()

    def open(self):
        self.sent = 0
        try:
            self.sock = socket.create_connection((host, port))
            self.sock.setblocking(False)
            return True
        except OSError:
            self.sock = None  # refused at once: tried again at the next tick
            return False

    def trickle(self):
        if self.sock is None:
            self.open()
        elif self.slow and self.sent < len(handshake) - 1:
            try:
                self.sock.send(handshake[self.sent:self.sent + 1])
                self.sent += 1
            except OSError:
                pass  # closed: seen as readable below


strangers = [Stranger(False) for _ in range(idle)] + [Stranger(True) for _ in range(slow)]
print("holding", len(strangers), flush=True)
reopened = 0
next_trickle = time.monotonic()
while True:
    by_fd = {s.sock.fileno(): s for s in strangers if s.sock is not None}
    ready, _, _ = select.select([sys.stdin] + list(by_fd), [], [], 0.5)
    for r in ready:
        if r is sys.stdin:
            if not sys.stdin.readline():
                print("reopened", reopened, flush=True)
                sys.exit(0)
            continue
        s = by_fd[r]
        try:
            if s.sock.recv(65536):
                continue  # an answer (a refusal): the close follows
        except OSError:
            pass
        s.sock.close()
        if s.open():
            reopened += 1
    if time.monotonic() >= next_trickle:
        next_trickle = time.monotonic() + 0.5
        for s in strangers:
            s.trickle()
