"""Where bench/scale.py's "receive" and "both" phases wait: timelines of one sender and one receiver (issue 26).

bench/scale.py says how fast; this says what paces it. One broker (``shardbus serve`` as users start it, or
RabbitMQ with ``--rabbitmq``), bench/scale.py's queue, clients and defaults (1 KB durable messages, window 100,
credit 100), and per phase:

    busy        each process's CPU over the phase's wall time (the broker's threads split into its event loop
                and the rest: commit threads, upkeep), so a process near 1.0 is the limit and one far below waits;
                and the time its threads were runnable but not on a CPU ("waiting", /proc/PID/task/*/schedstat):
                waiting for a core, not for an event
    sends       the sender's window: transfers in flight over time (median), and a send's latency (transfer to
                ``accepted``) by percentile
    commits     the broker's group commits (``SHARDBUS_STALL_TRACE``): how many, how long, how many ops each
    send life   a send's stages inside the broker (``SHARDBUS_STALL_TRACE_SENDS``, stalltrace.py), per send:
                from its read's first transfer to the dispositions' write, where the time between the transfer
                and ``accepted`` goes (the rest of the client's latency is the client and the sockets)
    receives    per receive call of the receiver: flow (grant) -> first delivery, first -> last delivery, the
                call's return -> the next call's flow (the caller's own work between calls), and the ranged
                complete's disposition -> the last echo

The clients are bench/scale.py's own (``role_send``, ``consume``) with their link calls wrapped to note times
(``time.perf_counter``: CLOCK_MONOTONIC, comparable across processes). The wrappers cost the clients a little CPU;
read the shares and latencies, not the rates.

    python bench/pace.py [--count N] [--window W] [--credit C] [--rabbitmq] [--tree DIR]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale  # bench/scale.py: its clients, its broker and its queue

TIMELINE_ENV = "PACE_TIMELINE"  # a child writes its timeline of each timed call to this file + a counter


# ================================================================================================================
# children: bench/scale.py's roles with the client's link calls wrapped
# ================================================================================================================


def _instrument() -> None:
    from shardbus import client as sc
    from shardbus.amqp import connection as amqp_connection
    from shardbus.amqp import transport

    out = os.environ[TIMELINE_ENV]
    marks: dict[str, list[Any]] = {"send": [], "grant": [], "delivery": [], "call": [], "settle": [], "write": []}
    calls = [0]

    def dump() -> None:
        calls[0] += 1
        Path(f"{out}.{calls[0]}").write_text(json.dumps(marks))
        for v in marks.values():
            v.clear()

    # A send's life, transfer -> outcome, noted where every send path meets: the engine's send_transfer or
    # send_deliveries (the sender's transfers; only the client's connection lives in this process) and the
    # disposition that settles it (handle_event below), whatever loop the client sends them with.
    send_transfer = amqp_connection.Connection.send_transfer
    started: dict[tuple[int, int], float] = {}

    def timed_transfer(self: Any, link: Any, *a: Any, **kw: Any) -> int:
        t0 = time.perf_counter()
        did = send_transfer(self, link, *a, **kw)
        started[(id(link.session), did)] = t0
        return did

    amqp_connection.Connection.send_transfer = timed_transfer  # type: ignore[method-assign]
    send_deliveries = amqp_connection.Connection.send_deliveries

    def timed_deliveries(self: Any, link: Any, deliveries: list[Any], **kw: Any) -> int:
        t0 = time.perf_counter()
        first = send_deliveries(self, link, deliveries, **kw)
        session = id(link.session)
        for did in range(first, first + len(deliveries)):
            started[(session, did & 0xFFFFFFFF)] = t0
        return first

    amqp_connection.Connection.send_deliveries = timed_deliveries  # type: ignore[method-assign]

    # The socket writes of a window's transfers (the client writes each fill at once): when they left, to set
    # beside the broker's "socket read came" (report_hops).
    write = transport.AmqpProtocol._write

    def timed_write(self: Any) -> None:
        size = len(self.conn._out)
        write(self)
        if size >= 8192:
            marks["write"].append((time.perf_counter(), size))

    transport.AmqpProtocol._write = timed_write  # type: ignore[method-assign]

    grant = transport.ClientReceiver.grant

    def timed_grant(self: Any, credit: int, drain: bool = False) -> None:
        marks["grant"].append((time.perf_counter(), credit, drain))
        grant(self, credit, drain)

    transport.ClientReceiver.grant = timed_grant  # type: ignore[method-assign]

    handle = transport.AmqpClient.handle_event

    def timed_handle(self: Any, protocol: Any, ev: Any) -> None:
        kind = type(ev).__name__
        if kind == "DeliveryReceived":
            marks["delivery"].append(time.perf_counter())
        elif kind == "DispositionReceived":
            now, session = time.perf_counter(), id(ev.session)
            for ref in ev.deliveries:
                t0 = started.pop((session, ref.delivery_id), None)
                if t0 is not None:
                    marks["send"].append((t0, now))
        handle(self, protocol, ev)

    transport.AmqpClient.handle_event = timed_handle  # type: ignore[method-assign]

    receive = sc.MessageReceiver.receive

    def timed_receive(self: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        got = receive(self, *a, **kw)
        marks["call"].append((t0, time.perf_counter(), len(got)))
        return got

    sc.MessageReceiver.receive = timed_receive  # type: ignore[method-assign]

    settle = sc.MessageReceiver._settle_async

    async def timed_settle(self: Any, deliveries: list[Any], outcome: Any) -> None:
        t0 = time.perf_counter()
        await settle(self, deliveries, outcome)
        marks["settle"].append((t0, time.perf_counter(), len(deliveries)))

    sc.MessageReceiver._settle_async = timed_settle  # type: ignore[method-assign]

    consume = scale.consume

    def timed_consume(*a: Any, **kw: Any) -> Any:
        for v in marks.values():
            v.clear()
        result = consume(*a, **kw)
        dump()
        return result

    scale.consume = timed_consume

    client_send = sc.ShardbusClient.send

    def timed_client_send(self: Any, *a: Any, **kw: Any) -> int:
        for v in marks.values():
            v.clear()
        n = client_send(self, *a, **kw)
        dump()
        return n

    sc.ShardbusClient.send = timed_client_send  # type: ignore[method-assign]


def _profile_loop_thread() -> None:
    """``PACE_PROFILE``: cProfile the client's event-loop thread (where it reads, decodes and settles) and print
    its busiest functions to stderr when the child ends."""
    import atexit
    import cProfile
    import io
    import pstats

    from shardbus import client as sc

    prof = cProfile.Profile()
    init = sc.ShardbusClient.__init__

    def profiled_init(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        self._loop.call_soon_threadsafe(prof.enable)

    sc.ShardbusClient.__init__ = profiled_init  # type: ignore[method-assign]

    def report() -> None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue(), file=sys.stderr)

    atexit.register(report)


def child(role: str, url: str, entity: str, option: int) -> None:
    if os.environ.get("PACE_PROFILE") == role:
        _profile_loop_thread()
    _instrument()
    if role == "send":
        scale.role_send(url, entity, option)
    else:
        scale.role_recv(url, entity, option)


class PacedRole(scale.Role):
    """bench/scale.py's child role, started through this script (which wraps the client's calls first)."""

    def __init__(self, role: str, url: str, entity: str, option: int, timeline: Path) -> None:
        super().__init__(role, url, entity, option, script=__file__, extra_env={TIMELINE_ENV: str(timeline)})


# ================================================================================================================
# the parent: per-process and per-thread CPU over a phase, and the timelines read back
# ================================================================================================================


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds by thread name of one process (threads of one name summed)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        key = "loop" if tid == str(pid) else name.rstrip("0123456789_-")
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
        try:  # schedstat: ns on a CPU, ns runnable but waiting for one, timeslices
            waited = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            waited = 0.0
        out[key + RUNQUEUE] = out.get(key + RUNQUEUE, 0.0) + waited
    return out


RUNQUEUE = " waiting"  # thread_cpu's entries for the run-queue wait (runnable, not on a CPU) of a kind of thread


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _ms(values: list[float]) -> str:
    return " / ".join(f"{_pct(values, q) * 1e3:.2f}" for q in (0.1, 0.5, 0.9, 0.99))


def read_timeline(path: Path) -> dict[str, Any]:
    files = sorted(path.parent.glob(path.name + ".*"), key=lambda p: int(p.suffix[1:]))
    return json.loads(files[-1].read_text())


def report_sends(marks: dict[str, Any], start: float, end: float) -> None:
    sends = [(a, b) for a, b in marks["send"] if a >= start - 1]
    if not sends:
        return
    latencies = [b - a for a, b in sends]
    events = sorted([(a, 1) for a, _ in sends] + [(b, -1) for _, b in sends])
    # in flight over time, sampled every 0.5 ms
    inflight, level, i, t = [], 0, 0, events[0][0]
    while t < events[-1][0]:
        while i < len(events) and events[i][0] <= t:
            level += events[i][1]
            i += 1
        inflight.append(level)
        t += 0.0005
    print(
        f"  sends: {len(sends)}; in flight median {statistics.median(inflight):.0f} (p10 {_pct(inflight, 0.1)}, "
        f"p90 {_pct(inflight, 0.9)}); latency transfer->accepted ms p10/p50/p90/p99 {_ms(latencies)}"
    )


def report_receives(marks: dict[str, Any]) -> None:
    calls, grants, deliveries, settles = marks["call"], marks["grant"], marks["delivery"], marks["settle"]
    if not calls:
        return
    flow_first, first_last, gap, after_last = [], [], [], []
    di = 0
    for k, (c0, c1, n) in enumerate(calls):
        g = next((g[0] for g in grants if c0 <= g[0] <= c1 and not g[2]), None)
        while di < len(deliveries) and deliveries[di] < c0:
            di += 1
        mine = [d for d in deliveries[di : di + n] if d <= c1]
        if g is not None and mine:
            flow_first.append(mine[0] - g)
            first_last.append(mine[-1] - mine[0])
            after_last.append(c1 - mine[-1])
        if k + 1 < len(calls):
            gap.append(calls[k + 1][0] - c1)
    echo = [b - a for a, b, _ in settles]
    per = [n for _, _, n in calls]
    wall = calls[-1][1] - calls[0][0]
    print(
        f"  receive calls: {len(calls)}, {statistics.mean(per):.1f} messages each; ms p10/p50/p90/p99:\n"
        f"    flow -> first delivery     {_ms(flow_first)}\n"
        f"    first -> last delivery     {_ms(first_last)}\n"
        f"    last delivery -> return    {_ms(after_last)}\n"
        f"    return -> next call        {_ms(gap)}\n"
        f"    disposition -> last echo   {_ms(echo)}  ({statistics.mean(n for *_, n in settles):.0f} per complete)\n"
        f"    shares of the phase's wall time: waiting for the first delivery "
        f"{sum(flow_first) / wall:.0%}, deliveries arriving {sum(first_last) / wall:.0%}, "
        f"between calls {sum(gap) / wall:.0%}"
    )


def report_commits(trace: Path, start: float, end: float) -> None:
    # the stall trace's clock is time.monotonic (CLOCK_MONOTONIC), as perf_counter's on Linux
    durations, ops = [], []
    if not trace.exists():
        print("  commits: no trace")
        return
    for line in trace.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "batch" and start <= float(parts[0]) <= end:
            durations.append(float(parts[1]) / 1e3)
            ops.append(int(parts[-1].split("=")[1]))
    if durations:
        span = end - start
        print(
            f"  group commits: {len(durations)} ({len(durations) / span:.0f}/s), ms p10/p50/p90/p99 "
            f"{_ms(durations)}, ops each median {statistics.median(ops):.0f} (p90 {_pct(ops, 0.9)}); commit "
            f"threads busy writing {sum(durations) / span:.2f} of a thread on average"
        )


_STAGES = (  # (label, from, to) over a "send" trace line's offsets (stalltrace.sends_written)
    ("socket read came -> first transfer decoded", "arrived", "read"),
    ("first transfer decoded -> handed to store", "read", "flushed"),
    ("handed -> commit thread took it", "flushed", "picked"),
    ("  staged (enqueue), or behind the store's batch", "flushed", "behind"),
    ("  the pool asked -> its thread ran", "queued", "picked"),
    ("commit (write + sync)", "picked", "stored"),
    ("  of which its thread on a CPU", "zero", "cpu"),
    ("stored -> callback ran (visible)", "stored", "resolved"),
    ("callback -> event loop ran it", "resolved", "loop"),
    ("loop: dispositions made", "loop", "acked"),
    ("made -> written to the socket", "acked", "written"),
    ("total: socket read -> dispositions written", "arrived", "written"),
)


def report_send_life(trace: Path, start: float, end: float) -> None:
    """The broker's ``send`` lines (stalltrace.py) in the phase: each stage's ms p50/p90 over sends (a group of
    n sends counts n times)."""
    stages: dict[str, list[float]] = {label: [] for label, _, _ in _STAGES}
    behind = groups = sends = 0
    for line in trace.read_text().splitlines() if trace.exists() else []:
        parts = line.split()
        if len(parts) < 4 or parts[2] != "send" or not start <= float(parts[0]) <= end:
            continue
        t = {k: float(v) for k, v in (f.split("=") for f in parts[3:])}
        t["flushed"] = t["zero"] = 0.0
        n = int(t["n"])
        groups += 1
        sends += n
        if t["queued"] == -1:  # formed while the store's previous batch was written
            behind += n
            t["behind"] = t["picked"]
            t["queued"] = float("nan")
        else:
            t["behind"] = t["queued"]
        for label, a, b in _STAGES:
            d = t[b] - t[a]
            if d == d:  # not NaN
                stages[label].extend([d / 1e3] * n)
    if not groups:
        print("  send life: no trace (SHARDBUS_STALL_TRACE_SENDS)")
        return
    print(
        f"  send life in the broker: {groups} groups, {sends / groups:.1f} sends each; {behind / sends:.0%} of sends "
        f"waited behind their store's previous batch; ms p10/p50/p90/p99 per send:"
    )
    for label, values in stages.items():
        print(f"    {label:<42} {_ms(values)}")


def report_hops(marks: dict[str, Any], trace: Path, start: float, end: float) -> None:
    """The sender's side of each group of the broker's trace (the clocks are the same CLOCK_MONOTONIC): from the
    client's write of the transfers to the broker's read of them, from the broker's dispositions (made, then
    written) to the client's handling of them, and from there to the client's write of the next transfers. Per group."""
    writes = sorted(t for t, _ in marks.get("write", []))
    outcomes = sorted({b for _, b in marks["send"]})
    hops: dict[str, list[float]] = {
        "client wrote transfers -> broker read came": [],
        "broker made dispositions -> client handled": [],
        "client handled -> wrote the next transfers": [],
    }
    for line in trace.read_text().splitlines() if trace.exists() and writes else []:
        parts = line.split()
        if len(parts) < 4 or parts[2] != "send" or not start <= float(parts[0]) <= end:
            continue
        t = {k: float(v) for k, v in (f.split("=") for f in parts[3:])}
        flushed = float(parts[0])
        # "acked" (dispositions made), not "written": the broker notes its write after the call returns, and the
        # client on the other core may have handled them by then
        arrived, acked = flushed + t["arrived"] / 1e3, flushed + t["acked"] / 1e3
        i = bisect.bisect_right(writes, arrived)
        if i:
            hops["client wrote transfers -> broker read came"].append(arrived - writes[i - 1])
        j = bisect.bisect_left(outcomes, acked)
        if j < len(outcomes):
            hops["broker made dispositions -> client handled"].append(outcomes[j] - acked)
            k = bisect.bisect_left(writes, outcomes[j])
            if k < len(writes):
                hops["client handled -> wrote the next transfers"].append(writes[k] - outcomes[j])
    if any(hops.values()):
        print("  the sender's hops, ms p10/p50/p90/p99 per group:")
        for label, values in hops.items():
            print(f"    {label:<42} {_ms(values)}")


def busy(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], wall: float) -> str:
    cells = []
    for proc, threads in after.items():
        was = before.get(proc, {})
        total = sum(v - was.get(k, 0.0) for k, v in threads.items() if not k.endswith(RUNQUEUE))
        parts = ", ".join(
            f"{name} {(v - was.get(name, 0.0)) / wall:.2f}"
            for name, v in sorted(threads.items(), key=lambda kv: -kv[1])
            if (v - was.get(name, 0.0)) / wall >= 0.02
        )
        cells.append(f"{proc} {total / wall:.2f} ({parts})")
    return "; ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role")
    ap.add_argument("--url")
    ap.add_argument("--entity")
    ap.add_argument("--option", type=int)
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--credit", type=int, default=100)
    ap.add_argument("--rabbitmq", action="store_true")
    ap.add_argument("--tree", type=Path, default=scale.ROOT, help="serve from another checkout (DIR/src)")
    args = ap.parse_args()
    if args.role:
        child(args.role, args.url, args.entity, args.option)
        return
    folder = Path(tempfile.mkdtemp(prefix="pace-"))
    trace = folder / "stall.trace"
    rabbit = None
    if args.rabbitmq:
        rabbit = scale.rabbitmq.RabbitNode(scale.rabbitmq.ensure_installed(folder / "apt-get.log"))
        rabbit.start()
        rabbit.declare_queue(scale.QUEUE)
        assert rabbit.proc is not None
        url, entity, pid = rabbit.url, rabbit.address(scale.QUEUE), rabbit.proc.pid
        serve = None
    else:
        os.environ["SHARDBUS_STALL_TRACE"] = str(trace)
        os.environ["SHARDBUS_STALL_TRACE_MS"] = "0"  # every commit, however short
        os.environ["SHARDBUS_STALL_TRACE_SENDS"] = "1"  # and every send's life (a tree without it ignores it)
        serve = scale.ShardbusServe(folder / "serve", [], tree=args.tree)
        del os.environ["SHARDBUS_STALL_TRACE"], os.environ["SHARDBUS_STALL_TRACE_SENDS"]
        url, entity, pid = serve.url, scale.QUEUE, serve.proc.pid
    snd = PacedRole("send", url, entity, args.window, folder / "send.timeline")
    rcv = PacedRole("recv", url, entity, args.credit, folder / "recv.timeline")
    procs = {"broker": pid, "sender": snd.proc.pid, "receiver": rcv.proc.pid}
    n = args.count
    try:
        for phase in ("receive", "both"):
            if phase == "receive":
                snd.command(f"send {n} pre")
                pre = snd.result()
                if serve is not None:  # the same sends with no receiver beside them: what "both" adds to them
                    print(f"send alone: {n / (pre['end'] - pre['start']):,.0f} msg/s")
                    report_sends(read_timeline(folder / "send.timeline"), pre["start"], pre["end"])
                    time.sleep(1.2)  # the trace is flushed about every second
                    report_send_life(trace, pre["start"], pre["end"])
                    report_hops(read_timeline(folder / "send.timeline"), trace, pre["start"], pre["end"])
            before = {name: thread_cpu(p) for name, p in procs.items()}
            t0 = time.perf_counter()
            rcv.command(f"recv {n}")
            if phase == "both":
                snd.command(f"send {n} both")
                s = snd.result()
            r = rcv.result()
            after = {name: thread_cpu(p) for name, p in procs.items()}
            start = s["start"] if phase == "both" else r["start"]
            wall = r["end"] - start
            print(f"{phase}: {n / wall:,.0f} msg/s over {wall:.2f} s")
            print(f"  busy (CPU s per wall s): {busy(before, after, time.perf_counter() - t0)}")
            if phase == "both":
                report_sends(read_timeline(folder / "send.timeline"), start, r["end"])
            report_receives(read_timeline(folder / "recv.timeline"))
            if serve is not None:
                time.sleep(1.2)  # the trace is flushed about every second
                report_commits(trace, start, r["end"])
                if phase == "both":
                    report_send_life(trace, start, r["end"])
                    report_hops(read_timeline(folder / "send.timeline"), trace, start, r["end"])
    finally:
        snd.stop()
        rcv.stop()
        if serve is not None:
            serve.stop()
        if rabbit is not None:
            rabbit.stop()


if __name__ == "__main__":
    main()
