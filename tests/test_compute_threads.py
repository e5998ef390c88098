"""An aborted attempt is over only once its compute thread is: client/training/stage_passes.py, in_thread.

A stage's passes run in worker threads. When the plan aborts an attempt, its task is cancelled while a backward
may still be running; if the task ended first, the next attempt would reset .grad and the old backward would then
add to it. That happened in CI (tests/test_step_faults.py, send_fails_after_delivery: every replica agreed, all on
another trajectory): the plan's vote cancelled the attempt during a backward, and its failed gradient send
cancelled it again through its TaskGroup, which cut the wait for the thread short.
"""
import asyncio
import threading

from hetswarm.client.training.stage_passes import in_thread

SEND_FAILS_AFTER_S = 0.05
WAIT_S = 5.0  # bounds every wait below, so a failing test cannot hang


def test_an_attempt_cancelled_by_the_vote_and_then_by_a_failed_send_ends_after_its_backward_thread():
    events: list[str] = []
    backward_may_end = threading.Event()

    def backward() -> None:
        backward_may_end.wait(WAIT_S)
        events.append("backward wrote .grad")

    async def failing_send() -> None:
        await asyncio.sleep(SEND_FAILS_AFTER_S)
        raise ConnectionError("the neighbour refused the gradients: it is at the next attempt")

    async def attempt() -> None:
        async with asyncio.TaskGroup() as sends:
            sends.create_task(failing_send())
            await in_thread(backward)

    async def abort_it() -> BaseException | None:
        body = asyncio.create_task(attempt())
        await asyncio.sleep(SEND_FAILS_AFTER_S / 5)
        body.cancel()  # the plan's vote, while the backward runs
        await asyncio.sleep(SEND_FAILS_AFTER_S * 4)  # the send fails meanwhile: its TaskGroup cancels the body again
        assert not body.done(), "the attempt ended while its backward thread was still running"
        backward_may_end.set()
        await asyncio.wait_for(asyncio.wait({body}), WAIT_S)
        events.append("attempt over")
        return None if body.cancelled() else body.exception()

    error = asyncio.run(abort_it())
    assert events == ["backward wrote .grad", "attempt over"]
    assert isinstance(error, BaseExceptionGroup) and isinstance(error.exceptions[0], ConnectionError), error


def test_a_finished_thread_returns_its_result():
    assert asyncio.run(in_thread(sum, [1, 2, 3])) == 6
