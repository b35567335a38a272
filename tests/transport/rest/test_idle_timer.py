"""The idle timeout of a connection (transport/httphost/protocols.py IdleTimer): what
hypercorn's TrioSingleTask does (restart: the action anew, stop: none running), with one
task for the connection's life; close ends that task."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from hypercorn.events import Updated
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from support.suspension import at_first_suspension

from actorserve.transport.httphost.protocols import IdleTimer, ProtocolWrapper, ServerConfig, install, use_parser


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
