"""The idle timeout of a connection (transport/httphost/protocols.py IdleTimer): what
hypercorn's TrioSingleTask does (restart: the action anew, stop: none running), with one
task for the connection's life; close ends that task. And issue 35: the end of a
response (the app's task) and the start of the next request (the reading task) leave
the timer as they happened, whichever of the two tasks trio resumes first."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.events import RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from support.suspension import at_first_suspension

from actorserve.transport.httphost.http1 import HttpToolsProtocol
from actorserve.transport.httphost.protocols import (
    IdleTimer,
    ProtocolWrapper,
    ServerConfig,
    install,
    use_parser,
)


@attrs.define
class Group:
    """hypercorn's TaskGroup, as much as the timer uses of it."""

    _nursery: trio.Nursery


async def test_restart_runs_the_action_anew_and_stop_ends_it(autojump_clock: trio.testing.MockClock) -> None:
    started: list[float] = []
    finished: list[float] = []

    async def action() -> None:  # an idle timeout of 10 s
        started.append(trio.current_time())
        await trio.sleep(10)
        finished.append(trio.current_time())

    timer = IdleTimer()
    async with trio.open_nursery() as nursery:
        tasks_before = len(nursery.child_tasks)
        await timer.restart(Group(nursery), action)  # the connection is accepted
        await trio.sleep(4)
        await timer.stop()  # a request starts: the timeout is off
        await trio.sleep(30)
        assert finished == []
        for _ in range(5):  # five requests answered back to back
            await timer.restart(Group(nursery), action)
            await trio.sleep(1)
            await timer.stop()
        assert len(nursery.child_tasks) == tasks_before + 1  # one task, all along
        await timer.restart(Group(nursery), action)  # the last response: idle from now
        await trio.sleep(15)
        assert finished == [started[-1] + 10]  # the whole timeout, counted from the last restart
    assert len(started) == 7


async def test_close_ends_the_timer_task(autojump_clock: trio.testing.MockClock) -> None:
    async def action() -> None:
        await trio.sleep_forever()

    timer = IdleTimer()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await timer.restart(Group(nursery), action)
            await timer.stop()  # a request is running when the client hangs up
            await trio.sleep(1)
            timer.close()
        # the nursery closed: the timer's task ended on its own
    await timer.restart(Group(nursery), action)  # after the close: nothing more starts


async def test_the_next_requests_stop_landing_first_leaves_the_timeout_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 35: a response ends (the app's task calls ``restart``) and the next request
    on the connection starts at once (the reading task calls ``stop``); trio may run the
    reading task's whole ``stop`` before the app's task comes back from its first
    checkpoint. The timeout must stay off through the next request, however long."""
    fired: list[float] = []

    async def action() -> None:  # an idle timeout of 5 s that closes the connection
        await trio.sleep(5)
        fired.append(trio.current_time())

    timer = IdleTimer()
    async with trio.open_nursery() as nursery:
        group = Group(nursery)
        await timer.restart(group, action)  # the connection is accepted
        await timer.stop()  # request A starts
        await trio.sleep(20)  # A streams for 20 s

        app_back = trio.Event()  # when the app's task may come back from its checkpoint
        app_done = trio.Event()

        async def end_of_response_a() -> None:
            await at_first_suspension(timer.restart(group, action), hold=app_back)
            app_done.set()

        nursery.start_soon(end_of_response_a)
        await trio.testing.wait_all_tasks_blocked()  # the app's task is in restart(), held
        await timer.stop()  # request B starts (the reading task), all of stop() at once
        app_back.set()
        await app_done.wait()
        b_started = trio.current_time()
        await trio.sleep(20)  # B streams for 20 s, 4 timeouts long
        assert fired == []  # B was never cut
        assert not timer.armed
        await timer.restart(group, action)  # B's response ends: idle from now
        await trio.sleep(6)
        assert fired == [b_started + 20 + 5]
        timer.close()


@pytest.mark.parametrize("protocol", ["httptools", "h11", "h2"])
async def test_every_protocols_send_sets_the_timer_before_it_first_yields(protocol: str) -> None:
    """What makes the order of the timer's updates the order of the protocol's decisions:
    from the ``send`` a protocol is given (our wrappers, then hypercorn's TCP server) to
    the timer's state, an ``Updated`` event passes no checkpoint. A wrapper that added one
    would bring issue 35 back; this says so."""
    install()
    config = ServerConfig()
    config.keep_alive_timeout = 5
    use_parser(config, "h11" if protocol == "h11" else "httptools")
    near, far = trio.socket.socketpair()
    with near, far:
        server = TCPServer(None, config, WorkerContext(None), {}, trio.SocketStream(near))  # type: ignore[arg-type]
        timer = server.idle_task
        assert isinstance(timer, IdleTimer)
        async with trio.open_nursery() as nursery:
            group = TaskGroup()
            group._nursery = nursery
            server._task_group = group
            wrapper = ProtocolWrapper(
                None,
                config,
                server.context,
                group,
                {},
                False,
                ("127.0.0.1", 1),
                ("127.0.0.1", 2),
                server.protocol_send,
                "h2" if protocol == "h2" else "http/1.1",
            )
            server.protocol = wrapper
            expected = {"httptools": "HttpToolsProtocol", "h11": "H11Protocol", "h2": "H2Protocol"}
            assert type(wrapper.protocol).__name__ == expected[protocol]
            send = wrapper.protocol.send
            states: list[bool] = []

            def probe() -> None:
                states.append(timer.armed)

            for idle in (True, False, True, False):
                await at_first_suspension(send(Updated(idle=idle)), probe=probe)
            assert states == [True, False, True, False]
            timer.close()  # disarmed: the timer's task ends at once


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_request_that_starts_as_the_response_before_ends_is_never_timed_out(
    autojump_clock: trio.testing.MockClock, parser: str
) -> None:
    """Issue 35 through an HTTP/1.1 protocol: response A ends (its task is in the
    protocol's recycle, A's stream already gone) while request B starts (the reading
    task), and the scheduler lets B's ``stop`` run before A decides whether the
    connection is idle, and A decide before B goes on. B streams for four timeouts; the
    timeout must not fire until B's response has ended."""
    fired: list[float] = []

    async def action() -> None:  # an idle timeout of 5 s that closes the connection
        await trio.sleep(5)
        fired.append(trio.current_time())

    a_back = trio.Event()  # when A's task may come back from its first checkpoint

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the (empty) request body
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        if scope["path"] == "/b":
            await trio.sleep(20)  # B streams for 20 s
            await send({"type": "http.response.body", "body": b"x"})
        else:  # A's last body ends the exchange in this task (the protocol's recycle)
            await at_first_suspension(send({"type": "http.response.body", "body": b"x"}), hold=a_back)

    timer = IdleTimer()
    written: list[bytes] = []
    b_back = trio.Event()  # when B may go on after its stop()

    async with trio.open_nursery() as nursery:
        group = TaskGroup()
        group._nursery = nursery
        requests = 0

        async def send(event: Any) -> None:  # hypercorn's TCP server, as the timer sees it
            nonlocal requests
            if isinstance(event, RawData):
                written.append(event.data)
            elif isinstance(event, Updated) and event.idle:
                await timer.restart(group, action)
            elif isinstance(event, Updated):
                await timer.stop()
                requests += 1
                if requests == 2:  # B: A's task runs before B comes back
                    await b_back.wait()

        config = ServerConfig()
        context = WorkerContext(None)
        args = (ASGIWrapper(app), config, context, group, ConnectionState({}), False, None, None, send)
        protocol: Any = HttpToolsProtocol(*args) if parser == "httptools" else H11Protocol(*args)
        await timer.restart(group, action)  # the connection is accepted

        await protocol.handle(RawData(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n"))
        await trio.testing.wait_all_tasks_blocked()  # A's end is under way, held
        assert b"".join(written).endswith(b"\r\n\r\nx")  # A is answered
        nursery.start_soon(protocol.handle, RawData(b"GET /b HTTP/1.1\r\nhost: t\r\n\r\n"))
        await trio.testing.wait_all_tasks_blocked()  # B's stop() has run (httptools)
        a_back.set()
        await trio.testing.wait_all_tasks_blocked()  # A has decided
        b_started = trio.current_time()
        b_back.set()
        await trio.sleep(19)
        assert fired == []  # B is streaming: never cut
        await trio.sleep(7)  # B ended at +20; idle from then
        assert b"".join(written).count(b"HTTP/1.1 200") == 2
        assert fired == [b_started + 20 + 5]
        timer.close()
        nursery.cancel_scope.cancel()
