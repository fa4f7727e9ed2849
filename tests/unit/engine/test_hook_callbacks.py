"""What a hook takes: plain callables; a coroutine function is refused at ``add``, not left to
make coroutines nobody awaits (the events it was given were lost, with only Python's
"never awaited" warning)."""

from __future__ import annotations

import functools

import pytest

from shallowmirror.engine.hooks import EngineHooks, Hook


def test_a_coroutine_function_is_refused_with_what_to_do():
    hooks = EngineHooks()

    async def on_ack(ack) -> None:
        return None

    with pytest.raises(TypeError, match=r"batch acknowledged hook: .*on_ack is a coroutine "
                                        r"function; hooks are called synchronously"):
        hooks.batch_acknowledged.add(on_ack)

    class Awaitable:
        async def __call__(self, event) -> None:
            return None

    with pytest.raises(TypeError, match="is a coroutine function"):
        hooks.partitions_assigned.add(Awaitable())
    assert not hooks.batch_acknowledged and not hooks.partitions_assigned


def test_plain_callables_are_taken_and_called():
    hook: Hook[int] = Hook("example")
    seen: list[int] = []
    hook.add(seen.append)
    hook.add(functools.partial(lambda tag, event: seen.append(tag * event), 10))
    with pytest.raises(TypeError, match="a callback must be callable, got int"):
        hook.add(5)
    hook(3)
    assert seen == [3, 30]


def test_removing_a_callback_never_added_names_the_hook_and_the_callback():
    """It raised list.remove's 'x not in list', naming neither."""
    import pytest

    from shallowmirror.engine.hooks import EngineHooks

    def mine(_event) -> None:
        pass

    hooks = EngineHooks()
    with pytest.raises(ValueError, match=r"partitions revoked hook: '.*mine' was never added"):
        hooks.partitions_revoked.remove(mine)
