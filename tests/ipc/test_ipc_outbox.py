"""The engine link's outbox: its writer gathers what the tasks woken with a message add
within a scheduler round or two, except when a message hurries (a new request, a
stream's first outputs: under load a round is every other runnable task's step)."""

from __future__ import annotations

import trio
import trio.testing

from actorserve.actors.pumped import Pumped
from actorserve.ipc.frames import encode_stream_entry, encode_stream_outputs
from actorserve.ipc.outbox import Outbox
from actorserve.types import InferenceResponse


async def test_the_writer_gives_the_woken_tasks_a_round_to_add_theirs() -> None:
    outbox = Outbox(max_messages=16, max_bytes=1 << 20)
    await outbox.put(b"A")
    with trio.testing.assert_checkpoints():
        assert await outbox.take(1 << 20) == [b"A"]


async def test_a_hurried_message_leaves_without_the_gather_rounds() -> None:
    outbox = Outbox(max_messages=16, max_bytes=1 << 20)
    await outbox.put(b"A")
    await outbox.put(b"B", hurry=True)
    with trio.testing.assert_no_checkpoints():  # not a round for anyone else to add theirs
        assert await outbox.take(1 << 20) == [b"A", b"B"]
    await outbox.put(b"C")
    with trio.testing.assert_checkpoints():  # the hurry was B's alone
        assert await outbox.take(1 << 20) == [b"C"]


async def test_a_stream_s_first_entry_hurries_and_still_joins_what_waits() -> None:
    outbox = Outbox(max_messages=16, max_bytes=1 << 20)
    first, other = encode_stream_entry(1, [[{}, [b"x"]]]), encode_stream_entry(2, [[{}, [b"y"]]])
    await outbox.put_entry(other, 1000)
    await outbox.put_entry(first, 1000, hurry=True)
    with trio.testing.assert_no_checkpoints():
        assert await outbox.take(1 << 20) == [encode_stream_outputs([other, first])]


async def _produce(out: Pumped, order: list[str]) -> None:
    for k in range(3):
        out.put(InferenceResponse(model_name="m", outputs=[], id=str(k)), trio.current_time())
        order.append(f"made {k}")
        if out.due(trio.current_time()):
            await out.turn()
    out.close()


async def _read(out: Pumped, order: list[str], writer_woken: trio.Event) -> None:
    batch = await out.next_batch()
    order.append(f"took {len(batch)}")
    writer_woken.set()
    async for _ in out:
        pass


async def _write(order: list[str], writer_woken: trio.Event) -> None:
    await writer_woken.wait()
    order.append("sent")


async def test_what_the_reader_wakes_for_the_first_response_runs_before_the_model_goes_on() -> None:
    """A model computing inline gets the loop back right after its first response is
    taken: whatever the reader woke to send it (a writer task) must run first, or the
    first token waits out the model's next :data:`~actorserve.actors.pumped.GATHER`.
    trio reverses a scheduler batch at random, so this runs many times."""
    for _ in range(40):
        out = Pumped(window=64)
        order: list[str] = []
        writer_woken = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write, order, writer_woken)
            nursery.start_soon(_read, out, order, writer_woken)
            nursery.start_soon(_produce, out, order)
        assert order[:4] == ["made 0", "took 1", "sent", "made 1"], order
