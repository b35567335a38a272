"""The compiled batched decode of the ``transformers`` runtime, and its dtype choice.

The eager decode (:meth:`.forward.Batch.step`) attends over exactly the positions used, so
its shapes change at every step and every time a row joins or leaves: ``torch.compile``
would compile again at each. Here the batch cache is **bucketed**: its rows are rounded up
to a power of two (the padding rows read token 0 and attend only to their own positions,
so they stay finite and no real row sees them), its length to a power of two (at least
:data:`MIN_CAPACITY`); every step writes the new position of all rows into one column of
the buffers (``index_copy_`` at a position held in a tensor, as ``StaticCache`` does) and
attends over the whole bucket with a mask built inside the graph from each row's left
padding and that column. The shapes are then fixed per bucket (``dynamic=False``): one
compile per (rows, length) bucket, reused by every batch of that bucket.

A bucket is compiled once it has run ``compile_after`` steps (0: at its first step), in a
thread of its own while the uncompiled bucketed forward answers, so the load stays fast
and no step waits for the compiler. A compile that fails (no C++ compiler, an inductor
error) is logged once as a WARNING and the model stays on the uncompiled forward.

With ``compile: cudagraphs`` (CUDA only; ``auto`` is eager everywhere until it is measured
faster) the decode is compiled with ``mode="reduce-overhead"`` (CUDA graphs): the
buffers of each bucket are kept from batch to batch (one pool per bucket) and marked
static, so a graph is recorded once per bucket and replayed at every step.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

#: the smallest cache length bucket
MIN_CAPACITY = 64
#: the ``compile`` parameter's values
COMPILE_MODES = ("auto", "eager", "inductor", "cudagraphs")


def rows_bucket(rows: int) -> int:
    """The batch size a decode of ``rows`` rows runs at: the next power of two, at least
    2 (dynamo specializes a dimension of size 1, so a dynamic batch starts at 2)."""
    return max(2, 1 << max(0, rows - 1).bit_length())


def capacity_bucket(length: int) -> int:
    """The cache length a batch holding ``length`` positions gets: the next power of two,
    at least :data:`MIN_CAPACITY`."""
    return max(MIN_CAPACITY, 1 << max(0, length - 1).bit_length())


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX), as vLLM decides
    its CPU default."""
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def choose_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """The dtype of the ``dtype`` parameter (``auto`` or absent: bf16 on a GPU that has it,
    else float16; on the CPU bf16 where it has AVX-512 BF16 or AMX, else float32)."""
    if name is None or name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and cpu_has_bf16():
            return torch.bfloat16
        return torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"parameter dtype {name!r}: expected one of {['auto', *sorted(dtypes)]}")
    return dtypes[name]


def choose_compile(name: str, device: torch.device) -> str:
    """What the ``compile`` parameter means on ``device``: ``eager`` (the unbucketed
    decode), ``inductor`` or ``cudagraphs``. ``auto`` is what measured fastest where it was
    measured: eager on the CPU, where the inductor decode measured about 2x slower
    (docs/llm.md#compiled-decode: the functionalized cache write copies the whole cache
    each step, and attention runs over the padded bucket with a mask, while eager's step
    is already 94% matrix products and attention); eager on a GPU too until the CUDA-graphs
    path has run on one (it is written and tested only where CUDA is)."""
    if name not in COMPILE_MODES:
        raise ValueError(f"parameter compile {name!r}: expected one of {list(COMPILE_MODES)}")
    if name == "cudagraphs" and device.type != "cuda":
        raise ValueError("parameter compile 'cudagraphs' needs a CUDA device")
    return "eager" if name == "auto" else name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def decoder_for(name: str, model: Any, device: torch.device, mode: str, compile_after: int) -> Decoder | None:
    """The decoder of a loaded model (None: eager); logs the dtype, device and decode."""
    log.info("model %r: %s on %s, decode %s", name, dtype_name(model.dtype), device, mode)
    return None if mode == "eager" else Decoder(model, device, mode, compile_after)


@functools.cache
def _fixed_layer() -> type:
    """The cache layer the bucketed decode gives the model (made on first use:
    ``transformers`` is an optional extra)."""
    from transformers.cache_utils import StaticLayer

    class Fixed(StaticLayer):  # type: ignore[no-untyped-call]
        """A ``StaticLayer`` over buffers of ours: ``update`` writes the new position of
        every row at ``column`` (a tensor: no recompile as it moves) and returns the
        whole buffers; the mask hides what is not a row's."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
            super().__init__(max_cache_len=int(keys.shape[-2]))
            self.keys, self.values, self.column = keys, values, column
            self.buffers = (keys, values)
            self.device = keys.device
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = self.buffers
            keys.index_copy_(2, self.column, key_states)
            values.index_copy_(2, self.column, value_states)
            return keys, values

    return Fixed


def static_cache(buffers: list[tuple[torch.Tensor, torch.Tensor]], column: torch.Tensor) -> Any:
    """A ``transformers`` cache over ``buffers`` (per layer, [B, heads, capacity, dim])
    writing at ``column``."""
    from transformers.cache_utils import Cache

    return Cache(layers=[_fixed_layer()(k, v, column) for k, v in buffers])


class Decoder:
    """The bucketed decode of one model: :meth:`run` steps a batch (compiled where its
    bucket is ready) and counts the steps of each bucket to start its compile."""

    def __init__(self, model: Any, device: torch.device, mode: str, compile_after: int) -> None:
        self.model = model
        self.device = device
        self.mode = mode  # inductor | cudagraphs
        self.compile_after = compile_after
        #: inductor: the batch dimension is dynamic (one compile per length bucket serves
        #: every row bucket); CUDA graphs record one graph per (rows, length) bucket
        self.dynamic_rows = mode == "inductor"
        self.bool_mask = getattr(model.config, "_attn_implementation", "sdpa") in (
            "sdpa",
            "flash_attention_2",
        )
        self.lock = threading.Lock()
        self.steps: dict[tuple[int, int], int] = {}
        self.ready: set[tuple[int, int]] = set()
        self.failed = False
        self.compiling: threading.Thread | None = None
        self.compile_seconds: dict[tuple[int, int], float] = {}
        self.compiled_steps = 0  # steps the compiled forward ran (tests)
        #: CUDA graphs want the same buffers at every replay: one pool per bucket
        self.pool: dict[tuple[int, int, int, int, int, int], torch.Tensor] | None = (
            {} if mode == "cudagraphs" else None
        )
        self.plain = self._forward
        self.fast: Callable[..., torch.Tensor] | None = None

    # -- buffers -------------------------------------------------------------------------------

    def buffer(
        self, layer: int, which: int, shape: tuple[int, int, int, int], like: torch.Tensor
    ) -> torch.Tensor:
        """A buffer of ``shape`` for layer ``layer``'s keys (0) or values (1): from the
        bucket's pool under CUDA graphs (same address at every replay; zeroed when new,
        what a batch left in it after: every position a row reads it wrote), else new and
        zeroed. A pool keeps every bucket it made until the model unloads."""
        if self.pool is None:
            return like.new_zeros(shape)
        key = (layer, which, *shape)
        found = self.pool.get(key)
        if found is None:
            found = self.pool[key] = like.new_zeros(shape)
            torch._dynamo.mark_static_address(found)
        return found

    # -- the forward ----------------------------------------------------------------------------

    def _forward(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pads: torch.Tensor,
        column: torch.Tensor,
    ) -> torch.Tensor:
        """Logits [B, V] of one bucketed step: row i attends to columns ``pads[i]`` up to
        ``column`` (its own positions and the one being written)."""
        capacity = cache.layers[0].keys.shape[-2]
        columns = torch.arange(capacity, device=input_ids.device)
        visible = ((columns >= pads) & (columns <= column)).unsqueeze(1).unsqueeze(1)
        mask: torch.Tensor = visible
        if not self.bool_mask:  # eager attention adds the mask to the scores
            dtype = self.model.dtype
            mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
            mask = mask.masked_fill(~visible, torch.finfo(dtype).min)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def run(
        self,
        buffers: list[tuple[torch.Tensor, torch.Tensor]],
        tokens: list[int],
        positions: torch.Tensor,
        pads: torch.Tensor,
        length: int,
    ) -> torch.Tensor:
        """One step over bucketed ``buffers`` writing column ``length``: the logits of the
        ``len(tokens)`` real rows (the others are padding)."""
        size, capacity = int(buffers[0][0].shape[0]), int(buffers[0][0].shape[-2])
        ids = torch.zeros((size, 1), dtype=torch.long)
        ids[: len(tokens), 0] = torch.tensor(tokens, dtype=torch.long)
        column = torch.tensor([length], dtype=torch.long, device=self.device)
        cache = static_cache(buffers, column)
        args = (cache, ids.to(self.device), positions, pads, column)
        bucket = (0 if self.dynamic_rows else size, capacity)
        fast = self.fast if bucket in self.ready else None
        if fast is not None:
            if self.dynamic_rows:
                self._dynamic(args)
            try:
                logits = fast(*args)[: len(tokens)]
                self.compiled_steps += 1
                # a CUDA graph's output is overwritten at its next replay
                return logits.clone() if self.mode == "cudagraphs" else logits
            except Exception as exc:  # an inductor error at run time: eager from now on
                self._fail(exc)
        self._count(bucket, buffers)
        return self.plain(*args)[: len(tokens)]

    # -- compiling ------------------------------------------------------------------------------

    def _count(self, bucket: tuple[int, int], buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.failed:
            return
        steps = self.steps[bucket] = self.steps.get(bucket, 0) + 1
        if steps <= self.compile_after:
            return
        if self.mode == "cudagraphs":
            # compiled and recorded in this thread at the bucket's next steps, over the
            # pool's buffers (a graph replays at the addresses it was recorded at)
            self.fast = self.fast or self._compiled()
            self.ready.add(bucket)
            return
        with self.lock:
            if self.compiling is not None and self.compiling.is_alive():
                return  # one compile at a time; this bucket asks again next step
            shapes = [(k.shape, v.shape, k.dtype) for k, v in buffers]
            self.compiling = threading.Thread(
                target=self._compile, args=(bucket, shapes), name=f"compile-{bucket}", daemon=True
            )
            self.compiling.start()

    @staticmethod
    def _dynamic(args: tuple[Any, ...]) -> None:
        """Mark the batch dimension of every tensor of ``args`` dynamic."""
        cache, ids, positions, pads, _column = args
        tensors = [ids, positions, pads]
        for layer in cache.layers:
            tensors += [layer.keys, layer.values]
        for tensor in tensors:
            torch._dynamo.mark_dynamic(tensor, 0)

    def _compiled(self) -> Callable[..., torch.Tensor]:
        import torch._dynamo.config

        # one graph per (rows, length) bucket: more than dynamo's default of 8 per function
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        mode = "reduce-overhead" if self.mode == "cudagraphs" else None
        dynamic = None if self.dynamic_rows else False  # None: as marked (mark_dynamic)
        return torch.compile(self._forward, dynamic=dynamic, fullgraph=True, mode=mode)

    def _compile(self, bucket: tuple[int, int], shapes: list[tuple[Any, Any, torch.dtype]]) -> None:
        """Compile ``bucket`` by running it on buffers of its shape (a thread of its own)."""
        import time

        started = time.perf_counter()
        log.info("compiling the decode of bucket %s (rows, length; 0 rows: any)", bucket)
        try:
            with torch.inference_mode():
                if self.fast is None:
                    self.fast = self._compiled()
                size = int(shapes[0][0][0])
                scratch = [
                    (
                        torch.zeros(ks, dtype=dtype, device=self.device),
                        torch.zeros(vs, dtype=dtype, device=self.device),
                    )
                    for ks, vs, dtype in shapes
                ]
                ids, positions, pads = (
                    torch.zeros((size, 1), dtype=torch.long, device=self.device) for _ in "ipp"
                )
                column = torch.tensor([0], dtype=torch.long, device=self.device)
                # three tensors, not one: dynamo guards on which inputs alias
                args = (static_cache(scratch, column), ids, positions, pads, column)
                if self.dynamic_rows:
                    self._dynamic(args)
                self.fast(*args)
        except Exception as exc:
            self._fail(exc)
            return
        seconds = time.perf_counter() - started
        self.compile_seconds[bucket] = seconds
        log.info("compiled the decode of bucket %s in %.1f s", bucket, seconds)
        self.ready.add(bucket)

    def _fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.failed:
                return
            self.failed = True
            self.ready.clear()
        log.warning(
            "torch.compile failed; the model decodes uncompiled from now on: %s: %s", type(exc).__name__, exc
        )

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a compile under way (unload)."""
        thread = self.compiling
        if thread is not None:
            thread.join(timeout)
