"""Which materialized groups enter the trainer's FIFO: the trainer's hook ``group_is_trainable`` (a subclass
overrides it) and the filters a caller gives for some steps (``filtering_groups``: a session, a test), asked together
by ``keeps_group``. A mixin of RolloutPipeTrainer; docs/extending.md, "Which groups are trained".

Pure: no verl, Ray or asyncio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

GroupFilter = Callable[[int, Any], bool]  # (group index, its materialized DataProto) -> keep it


class GroupFilters:
    """``filtering_groups`` and ``keeps_group`` for a class that defines ``group_is_trainable(group, piece)``."""

    _group_filters: tuple[GroupFilter, ...] = ()  # the run-time ones, set only by filtering_groups

    @contextmanager
    def filtering_groups(self, keep: GroupFilter) -> Iterator[None]:
        """Within the block, a materialized group enters the FIFO only if ``keep(group, piece)`` says so as well as
        ``group_is_trainable``: a filter for some steps, given by a caller instead of a subclass. Blocks nest (every
        filter applies); leaving one, by an error too, restores the filters before it. Enter it between steps: a
        step in flight reads the filters as each of its groups completes (in the rollout thread)."""
        if not callable(keep):
            raise TypeError(f"filtering_groups needs a function (group, piece) -> bool, got {keep!r}")
        before = self._group_filters
        self._group_filters = (*before, keep)
        try:
            yield
        finally:
            self._group_filters = before

    def keeps_group(self, group: int, piece) -> bool:
        """Whether a materialized group enters the FIFO: the hook, then every run-time filter, in the order given."""
        return bool(self.group_is_trainable(group, piece)) and all(keep(group, piece) for keep in self._group_filters)
