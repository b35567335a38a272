"""A bounded, single-consumer mailbox.

Every sequence actor owns one, and every in-flight request has one for its replies, so
it is kept small: a list and one task slot, no channel pair, no parking lot. One task
(the owner) receives; :meth:`Mailbox.send_nowait` may be called by anyone and never
waits: a full mailbox is an error the sender reports, not a queue of senders.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs
import trio

from ..errors import Overloaded

T = TypeVar("T")


@attrs.frozen
class MailboxStatistics:
    queued: int
    capacity: int
    closed: bool
    receiver_waiting: bool


class Mailbox(Generic[T]):
    """Fixed-capacity FIFO. ``send_nowait`` on a full mailbox raises
    :class:`~actorserve.errors.Overloaded` (nothing is dropped); ``receive`` on a closed,
    empty mailbox raises :class:`trio.EndOfChannel`; sending to a closed mailbox raises
    :class:`trio.ClosedResourceError`.
    """

    __slots__ = ("_capacity", "_closed", "_items", "_receiver", "name")

    def __init__(self, capacity: int, name: str = "mailbox") -> None:
        if capacity < 1:
            raise ValueError("a mailbox needs a capacity of at least 1")
        self._capacity = capacity
        self._items: list[T] = []
        self._receiver: trio.lowlevel.Task | None = None
        self._closed = False
        self.name = name

    def __len__(self) -> int:
        return len(self._items)

    @property
    def capacity(self) -> int:
        return self._capacity

    def full(self) -> bool:
        return len(self._items) >= self._capacity

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(len(self._items), self._capacity, self._closed, self._receiver is not None)

    def send_nowait(self, item: T) -> None:
        if self._closed:
            raise trio.ClosedResourceError(f"{self.name} is closed")
        if len(self._items) >= self._capacity:
            raise Overloaded(f"{self.name} is full ({self._capacity} queued)", bound="mailbox_full")
        self._items.append(item)
        if self._receiver is not None:
            trio.lowlevel.reschedule(self._receiver)
            self._receiver = None

    def _abort_receive(self, _: object) -> trio.lowlevel.Abort:
        self._receiver = None
        return trio.lowlevel.Abort.SUCCEEDED

    def receive_nowait(self) -> T:
        if not self._items:
            if self._closed:
                raise trio.EndOfChannel
            raise trio.WouldBlock
        return self._items.pop(0)

    async def receive(self) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._items and not self._closed:
            assert self._receiver is None, "a mailbox has a single receiver"
            self._receiver = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort_receive)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return self.receive_nowait()

    def close(self) -> list[T]:
        """Close; items still queued stay receivable. Wakes a waiting receiver."""
        self._closed = True
        if self._receiver is not None:
            trio.lowlevel.reschedule(self._receiver)
            self._receiver = None
        return list(self._items)

    def drain(self) -> list[T]:
        """Close and take every queued item."""
        self.close()
        items, self._items = self._items, []
        return items
