"""When to pack the next pass, so that it holds what arrived while the pass before it ran.

    ModelRunner.run_all(clock=LaunchClock): pass k is on the device (pass k-1's outputs read)
      clock.wait_to_pack(k): host work in the waits, then sleep, until k's predicted end - margin
      pack pass k+1 (the packer asks for arrivals now), launch it: clock.launched(host seconds)
      pass k done: clock.observe(k's tokens, k's device seconds)
    k's predicted end = when k started (pass k-1 seen done, or k's launch) + tokens x the recent
      device seconds per token
    margin = the recent host seconds of packing + launching one pass x MARGIN_FACTOR + MARGIN_S

Without a clock the next pass is packed as soon as the one before it is launched, a whole pass
ahead: a sync call that comes in then waits for two passes before its own. With the clock it
waits for the rest of the pass in flight (or, in the last `margin` of it, one pass more). The
device idles only when a pass ends before its prediction; a pass that is shorter than the
margin is packed at once, as without a clock. CUDA only: on CPU a pass runs inside its launch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

EMA_WEIGHT = 0.25  # of the newest observation
MARGIN_FACTOR = 1.25
MARGIN_S = 0.003
SLEEP_S = 0.001


class LaunchClock:
    def __init__(self, clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep):
        self.clock = clock
        self.sleep = sleep
        self.seconds_per_token: float | None = None  # device seconds of a pass per padded token
        self.launch_s: float | None = None  # host seconds to pack and launch one pass
        self.step_s = 0.0  # host seconds of one `while_waiting` step (the longest recent one, decaying)

    def observe(self, num_tokens: int, device_s: float) -> None:
        """A pass of `num_tokens` padded tokens took `device_s` on the device."""
        if num_tokens > 0 and device_s > 0:
            self.seconds_per_token = _ema(self.seconds_per_token, device_s / num_tokens)

    def launched(self, host_s: float) -> None:
        """Packing and launching one pass took `host_s` on the host."""
        self.launch_s = _ema(self.launch_s, host_s)

    def margin_s(self) -> float:
        return (self.launch_s or 0.0) * MARGIN_FACTOR + MARGIN_S

    def pack_at(self, started_at: float, num_tokens: int) -> float | None:
        """When to pack the pass after one of `num_tokens` that started at `started_at`; None
        before any pass was observed (then at once)."""
        if self.seconds_per_token is None:
            return None
        return started_at + num_tokens * self.seconds_per_token - self.margin_s()

    def wait_until(self, deadline: float | None, is_done: Callable[[], bool],
                   while_waiting: Callable[[], bool] | None = None) -> None:
        """Until `deadline` or `is_done()`: `while_waiting()` steps while it returns True and a
        step fits before the deadline, then short sleeps."""
        if deadline is None:
            return
        has_work = while_waiting is not None
        while (now := self.clock()) < deadline and not is_done():
            if has_work and now + self.step_s < deadline:
                has_work = self._step(while_waiting)
            else:
                self.sleep(min(SLEEP_S, deadline - now))

    def _step(self, while_waiting: Callable[[], bool]) -> bool:
        began = self.clock()
        more = while_waiting()
        self.step_s = max(self.clock() - began, self.step_s * (1 - EMA_WEIGHT))
        return more


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + EMA_WEIGHT * (new - old)
