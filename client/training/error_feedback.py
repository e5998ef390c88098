"""Error feedback: what compression cut from one step's gradient is added to the next step's, so it is delayed, not lost.

With e_t the residual carried into step t and C the codec's round trip (protocol/codecs.py),

    sent_t = C(g_t + e_t),    e_(t+1) = g_t + e_t − sent_t,

so that Σ_t sent_t = Σ_t g_t − e_(T+1): over a run, what was sent sums to what was computed but for the last
residual (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "Error Feedback Fixes SignSGD"). An all-reduce
compresses twice, a member's parts on their way to the reducers and each reducer's average on its way back, and each
side keeps its own residual (Tang et al. 2019, "DoubleSqueeze").

A step can be tried more than once (client/training/step_commit.py). A retry must start from the residuals the
step's first try started from, so a round's residuals are kept aside and take effect only when a later step
begins, which means the step they were made for was committed. A round is one attempt of a step, and only the
round in progress may record: a reducer of an abandoned attempt can still answer a member's request after the
retry began, and its residual must not become the retry's.
"""
from collections.abc import Hashable

import torch

from hetswarm.protocol.keys import AttemptKey

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """The residuals of one stage group member, by key (a tensor it sends, a part it reduces)."""

    def __init__(self) -> None:
        self._carried: dict[Hashable, torch.Tensor] = {}
        self._made: dict[Hashable, torch.Tensor] = {}
        self._made_for: int | None = None
        """The step `_made` belongs to, once its round completed."""
        self._round: AttemptKey | None = None

    def begin(self, step: int, attempt: int = 0) -> None:
        """Starts a round of `step`: a later step than the last completed round's carries that round's residuals
        on; a retry of it starts again from what it started from; an earlier step (a roll-back) starts from none."""
        if self._made_for is not None and step > self._made_for:
            self._carried = self._made
        elif self._round is not None and step < self._round[0]:
            self._carried = {}
        self._made, self._made_for, self._round = {}, None, (step, attempt)

    def residual(self, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The residual carried into this round for `key`: zeros when there is none (a first step, a new plan)."""
        carried = self.carried(key, like.shape)
        return torch.zeros_like(like) if carried is None else carried

    def carried(self, key: Hashable, shape: torch.Size | tuple[int, ...]) -> torch.Tensor | None:
        """What the last committed round recorded for `key`, if of `shape`: a residual, or other state that must
        start a retry where its first try started (a low-rank round's factor, client/training/low_rank.py)."""
        carried = self._carried.get(key)
        return carried if carried is not None and carried.shape == shape else None

    def record(self, round_: AttemptKey, key: Hashable, residual: torch.Tensor) -> None:
        """The residual `round_` made for `key`: what it meant to send minus what the receiver decodes; dropped
        when `round_` is no longer the round in progress (module docstring)."""
        if round_ == self._round:
            self._made[key] = residual

    def made(self) -> dict[Hashable, torch.Tensor]:
        """The residuals the round in progress recorded so far."""
        return dict(self._made)

    def complete(self, round_: AttemptKey) -> None:
        """`round_` succeeded: its residuals are carried on if its step is committed (`begin` of a later step)."""
        if round_ == self._round:
            self._made_for = round_[0]
