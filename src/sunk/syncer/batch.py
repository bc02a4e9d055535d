"""One Slurm request for many nodes: the syncer's node writes, coalesced.

A mass change (a rack cordoned, a hundred nodes uncordoned) makes every
reconciler ask for the same update on its own node: a drain with one reason,
a resume. One request each, those queue at the write rate limit; slurmctld
takes a hostlist in one update, so they go as one `POST node/{hostlist}`.

The rule: requests for the same update (equal `NodeUpdate`: same state and
reason, or same comment) that arrive within WINDOW of the first, or while a
write of that update is in flight, go out together (at most MAX_BATCH nodes
a request). A single change waits only WINDOW. Each caller's await returns
when its node is written, or raises the error for its node: when Slurm
refuses a request for several nodes, they are written again one by one, so
one bad node does not fail the others (a drain or comment written twice is
the same). A resume refused because a node is not drained (any more: a
repeat after a stale read) is done for every node of the request: slurmctld
goes on through the hostlist past that node (a contract test shows it), so
the others are resumed by the same request. The rate limit is taken per
request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from sunk.slurm.errors import ESLURM_INVALID_NODE_STATE, SlurmApiError, SlurmAuthError
from sunk.slurm.models import NodeUpdate

log = logging.getLogger(__name__)

Write = Callable[[Sequence[str], NodeUpdate], Awaitable[None]]
Acquire = Callable[[], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]

# Reconcilers of one mass change reach the writer spread out by their own reads
# (a guard read of the node takes a few ms on slurmrestd): 5 ms gathers those
# that come nearly together, and costs a single change no more than one such
# read. Later ones gather while the write is in flight.
WINDOW = 0.005
# The hostlist goes in the URL: 64 names of up to 63 characters stay within the
# 8 KiB request line HTTP servers and proxies commonly accept.
MAX_BATCH = 64
# Slurm's "no" to resuming a node neither drained nor down: 2028 on 24.11,
# 2180 ("Invalid node state transition") on 26.05: that node is resumed
# already, and Slurm went on through the rest of the hostlist.
_NOT_RESUMABLE = frozenset([ESLURM_INVALID_NODE_STATE, 2180])

_Waiters = dict[str, list[asyncio.Future[None]]]  # node name → its callers


def _per_node(error: SlurmApiError) -> bool:
    """Might writing the nodes one by one get some of them through?

    Not when the token is refused or slurmctld cannot be reached: every node
    would fail alike, and a struggling slurmctld would get more requests.
    """
    return not isinstance(error, SlurmAuthError) and not error.transient


def _settle(futures: Sequence[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():  # its caller was cancelled
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class BatchWriter:
    """Slurm node updates from many callers, sent as few requests as will do.

    `write` sends one update to some nodes (`SlurmClient.update_nodes`);
    `acquire` waits for the rate limit, once per request.
    """

    def __init__(
        self,
        write: Write,
        acquire: Acquire,
        *,
        window: float = WINDOW,
        max_batch: int = MAX_BATCH,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if max_batch < 1:
            raise ValueError("a batch needs room for at least one node")
        self._write = write
        self._acquire = acquire
        self._window = window
        self._max_batch = max_batch
        self._sleep = sleep
        self._waiting: dict[NodeUpdate, _Waiters] = {}
        # One sender per update while it has callers; held here so it is not collected.
        self._senders: dict[NodeUpdate, asyncio.Task[None]] = {}

    async def drain(self, name: str, reason: str) -> None:
        await self.update(name, NodeUpdate(state="DRAIN", reason=reason))

    async def resume(self, name: str) -> None:
        await self.update(name, NodeUpdate(state="RESUME"))

    async def comment(self, name: str, comment: str) -> None:
        await self.update(name, NodeUpdate(comment=comment))

    async def update(self, name: str, update: NodeUpdate) -> None:
        """Apply `update` to node `name`, in one request with others' equal updates."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(update, {}).setdefault(name, []).append(future)
        if update not in self._senders:
            self._senders[update] = asyncio.create_task(self._send_all(update))
        await future

    def _take(self, update: NodeUpdate) -> _Waiters:
        """Up to max_batch waiting nodes, leaving out those whose callers all gave up."""
        waiting = self._waiting.get(update, {})
        batch: _Waiters = {}
        for name in list(waiting):
            if len(batch) == self._max_batch:
                break
            futures = [f for f in waiting.pop(name) if not f.done()]
            if futures:
                batch[name] = futures
        if not waiting:
            self._waiting.pop(update, None)
        return batch

    async def _send_all(self, update: NodeUpdate) -> None:
        """Send `update` until no caller waits for it."""
        batch: _Waiters = {}
        try:
            await self._sleep(self._window)
            while update in self._waiting:
                await self._acquire()
                batch = self._take(update)
                if batch:
                    await self._send(update, batch)
        except BaseException:
            # Cancelled (the loop shuts down): no caller may wait forever.
            waiting = self._waiting.pop(update, {})
            for futures in [*batch.values(), *waiting.values()]:
                for future in futures:
                    future.cancel()
            raise
        finally:
            del self._senders[update]

    async def _send(self, update: NodeUpdate, batch: _Waiters) -> None:
        names = list(batch)
        everyone = [future for futures in batch.values() for future in futures]
        try:
            await self._write(names, update)
        except SlurmApiError as error:
            if update.state == "RESUME" and error.errno in _NOT_RESUMABLE:
                _settle(everyone, None)
                return
            if len(names) == 1 or not _per_node(error):
                _settle(everyone, error)
                return
            what = update.model_dump(exclude_none=True)
            log.info("%s on %d nodes refused (%s): one by one", what, len(names), error)
            await asyncio.gather(*(self._send_one(update, n, batch[n]) for n in names))
        except Exception as error:
            _settle(everyone, error)
        else:
            _settle(everyone, None)

    async def _send_one(
        self, update: NodeUpdate, name: str, futures: Sequence[asyncio.Future[None]]
    ) -> None:
        await self._acquire()
        try:
            await self._write([name], update)
        except SlurmApiError as error:
            if update.state == "RESUME" and error.errno in _NOT_RESUMABLE:
                _settle(futures, None)  # resumed by the request for many: done
            else:
                _settle(futures, error)
        except Exception as error:
            _settle(futures, error)
        else:
            _settle(futures, None)
