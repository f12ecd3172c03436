"""A packet delayer for kernels without sch_netem: holds each packet of an NFQUEUE for a fixed time, then
accepts it, in order. Runs inside a lab host's network namespace (netfilter queues are per namespace):

    ip netns exec osfl-lab1 python -m osfleet.chaos.delayer --queue 7477 --delay-ms 200

with ``iptables -A <chain> -o <dev> -j NFQUEUE --queue-num 7477 --queue-bypass`` in that namespace, so
packets pass undelayed whenever no delayer is bound. Speaks nfnetlink_queue directly over a netlink
socket (copy mode "meta": only the packet id comes up, never the payload). Prints ``ready <pid>`` once
bound; SIGTERM accepts every held packet, unbinds and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import heapq
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
NF_ACCEPT = 1
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NFGEN = struct.Struct("=BBH")  # family, version, res_id (big-endian queue number)


def _attr(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


class Queue:
    """One bound NFQUEUE: receive packet ids, send verdicts."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 2**20)
        self.sock.bind((0, 0))

    def _send(self, msg_type: int, attrs: list[bytes], ack: bool = False) -> None:
        self.seq += 1
        body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(self.number)) + b"".join(attrs)
        flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
        header = _NLMSG.pack(_NLMSG.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, self.seq, 0)
        self.sock.send(header + body)
        if ack:
            self._ack()

    def _ack(self) -> None:
        data = self.sock.recv(65536)
        _length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data)
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, _NLMSG.size)
            if code:
                raise OSError(-code, f"nfnetlink_queue: {errno.errorcode.get(-code, code)}")

    def bind(self) -> None:
        self._send(NFQNL_MSG_CONFIG, [_attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_BIND, 0))], ack=True)
        self._send(NFQNL_MSG_CONFIG, [_attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))], ack=True)

    def unbind(self) -> None:
        with contextlib.suppress(OSError):
            self._send(NFQNL_MSG_CONFIG, [_attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_UNBIND, 0))])

    def accept(self, packet_id: int) -> None:
        self._send(NFQNL_MSG_VERDICT, [_attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))])

    def packets(self) -> Iterator[int]:
        """Ids of the packets in one read from the socket."""
        try:
            data = self.sock.recv(2**20)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # the kernel dropped messages; their packets are lost
                return
            raise
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                pos, end = offset + _NLMSG.size + _NFGEN.size, offset + length
                while pos + 4 <= end:
                    size, attr = struct.unpack_from("=HH", data, pos)
                    if size < 4:
                        break
                    if attr & 0x7FFF == NFQA_PACKET_HDR:
                        yield struct.unpack_from(">I", data, pos + 4)[0]
                    pos += (size + 3) & ~3
            offset += (length + 3) & ~3


def run(number: int, delay_s: float) -> None:
    queue = Queue(number)
    queue.bind()
    held: list[tuple[float, int]] = []
    stopping = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"ready {os.getpid()}", flush=True)
    with contextlib.suppress(OSError):  # nothing more to say; the starter may be gone
        os.close(1)
    while not stopping:
        wait = max(0.0, held[0][0] - time.monotonic()) if held else 1.0
        try:
            readable, _, _ = select.select([queue.sock], [], [], wait)
        except InterruptedError:
            continue
        if readable:
            now = time.monotonic()
            for packet_id in queue.packets():
                heapq.heappush(held, (now + delay_s, packet_id))
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.accept(heapq.heappop(held)[1])
    for _due, packet_id in sorted(held):
        queue.accept(packet_id)
    queue.unbind()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-ms", type=int, required=True)
    args = parser.parse_args()
    try:
        run(args.queue, args.delay_ms / 1000)
    except OSError as exc:
        print(f"error: {exc}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
