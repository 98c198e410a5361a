"""Counting the calls of a compiled fast path, shared by the instrumentation tests."""


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` (a module's kernel) by a wrapper that calls it and appends
    to the returned list: a test then asserts the fast path was (or was not) taken."""
    calls, real = [], getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls
