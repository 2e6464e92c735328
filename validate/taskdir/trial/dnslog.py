"""The trial's resolver: a DNS responder that answers every question NXDOMAIN and logs the
name asked, run by the harness as PID 1 of a sidecar container whose network namespace the
agent's and the verifier's containers join (`validate.taskdir.trial.network`).

This file is uploaded into the sidecar and run there (Python 3 standard library only; it
imports nothing of the harness). It listens on 127.0.0.1:53 over UDP and TCP and, for each
question it has not seen since the last mark, writes one JSON line to its stdout
(``{"name": …, "type": …, "via": "udp"|"tcp"}``), which the harness reads through docker's
log API: nothing an agent or a verifier does reaches that stream except by asking a name.

A ``SIGUSR1`` (the harness's ``docker kill --signal``, once a phase's container is dead:
nothing in a task container can signal this process) is a *phase boundary*: every question
already waiting (datagrams, queued connections) is served and logged, ``/etc/resolv.conf``
and ``/etc/hosts`` are rewritten in place (every container that joins this one's network
namespace shares these two files, and an agent running as root may have rewritten them),
then ``{"mark": n}`` (the n-th boundary) is written and what was seen forgotten. So every
question asked before a boundary is logged before its mark.

The log is bounded: names are capped at `MAX_NAMES` per phase (then one ``{"overflow": n}``
line), each rendered in DNS presentation form with unprintable bytes escaped ``\\DDD``.
"""

import json
import os
import select
import signal
import socket
import struct
import sys

MAX_NAMES = 200
TCP_READ_S = 1.0
RESOLV_CONF = "nameserver 127.0.0.1\n"
HOSTS = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
         "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")


def name_of(msg):
    """(name, qtype) of the first question of a DNS message, or None when it is malformed."""
    if len(msg) < 12 or struct.unpack("!H", msg[4:6])[0] < 1:
        return None
    labels, i = [], 12
    while i < len(msg):
        n = msg[i]
        if n == 0:
            break
        if n & 0xC0 or i + 1 + n > len(msg) or len(labels) > 127:
            return None
        raw = msg[i + 1:i + 1 + n]
        labels.append("".join(chr(b) if 0x21 <= b < 0x7F and b not in (0x2E, 0x5C) else "\\%03d" % b
                              for b in raw))
        i += 1 + n
    if i + 5 > len(msg):
        return None
    return ".".join(labels).lower(), struct.unpack("!H", msg[i + 1:i + 3])[0]


def answer(msg):
    """NXDOMAIN for the question (RA set, the question echoed), or None for non-queries."""
    if len(msg) < 12 or msg[2] & 0x80:
        return None
    flags = 0x8000 | (msg[2] & 0x79) << 8 | 0x0080 | 3  # QR, opcode and RD kept, RA, NXDOMAIN
    end = 12
    while end < len(msg) and msg[end] != 0 and not msg[end] & 0xC0:
        end += 1 + msg[end]
    question = msg[12:end + 5] if struct.unpack("!H", msg[4:6])[0] >= 1 and end + 5 <= len(msg) else b""
    return msg[:2] + struct.pack("!HHHHH", flags, 1 if question else 0, 0, 0, 0) + question


class Log:
    def __init__(self):
        self.seen, self.dropped, self.marks = set(), 0, 0

    def mark(self):
        if self.dropped:
            self.emit({"overflow": self.dropped})
        self.seen, self.dropped, self.marks = set(), 0, self.marks + 1
        self.emit({"mark": self.marks})

    def note(self, msg, via):
        got = name_of(msg)
        if got is None:
            return
        name, qtype = got
        if name not in self.seen:
            if len(self.seen) >= MAX_NAMES:
                self.dropped += 1
                return
            self.seen.add(name)
            self.emit({"name": name, "type": qtype, "via": via})

    @staticmethod
    def emit(obj):
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()


def serve_tcp(conn, log):
    conn.settimeout(TCP_READ_S)
    try:
        head = conn.recv(2, socket.MSG_WAITALL)
        if len(head) < 2:
            return
        msg = conn.recv(struct.unpack("!H", head)[0], socket.MSG_WAITALL)
        log.note(msg, "tcp")
        reply = answer(msg)
        if reply:
            conn.sendall(struct.pack("!H", len(reply)) + reply)
    except (OSError, ValueError, IndexError, struct.error):
        pass
    finally:
        conn.close()


def rewrite_files():
    """The resolver's files as the harness set them (the host's own name without DNS)."""
    hosts = HOSTS + "127.0.1.1\t" + socket.gethostname() + "\n"
    for path, text in (("/etc/resolv.conf", RESOLV_CONF), ("/etc/hosts", hosts)):
        try:
            os.chown(path, 0, 0)
            os.chmod(path, 0o644)
            with open(path, "w") as f:  # in place: they are bind mounts
                f.write(text)
        except OSError as e:
            Log.emit({"error": "%s: %s" % (path, e)})


def serve_udp(udp, log):
    """Every datagram waiting now, in order."""
    while True:
        try:
            msg, peer = udp.recvfrom(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            continue
        try:
            log.note(msg, "udp")
            reply = answer(msg)
            if reply:
                udp.sendto(reply, peer)
        except (OSError, ValueError, IndexError, struct.error):
            pass  # one bad datagram never stops the responder


def serve_queued_tcp(tcp, log):
    """Every connection already queued, in order."""
    tcp.setblocking(False)
    try:
        while True:
            try:
                conn, _ = tcp.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            conn.setblocking(True)
            serve_tcp(conn, log)
    finally:
        tcp.setblocking(True)


def main():
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 53))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", 53))
    tcp.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # the wakeup fd carries it to the loop
    log = Log()
    rewrite_files()
    log.emit({"ready": True})
    while True:
        readable, _, _ = select.select([udp, tcp, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 64)
            serve_udp(udp, log)
            serve_queued_tcp(tcp, log)
            rewrite_files()
            log.mark()
            continue
        if udp in readable:
            serve_udp(udp, log)
        if tcp in readable:
            serve_queued_tcp(tcp, log)


if __name__ == "__main__":
    main()
