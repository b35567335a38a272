"""The built-in models, served by ``python -m actorserve`` without a model folder."""

from __future__ import annotations

from pathlib import Path

from ..settings import ANY_DATATYPE, ModelSettings, SequenceSettings, TensorSpec

#: The ``text`` model's chat template: each message as a speaker's turn of the plays the
#: model learnt from (``USER:`` / ``ASSISTANT:`` / ``SYSTEM:``, the text, a blank line),
#: then ``ASSISTANT:`` for the reply. A turn ends at a blank line (``chat_stop``).
TEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message.role | upper }}:\n{{ message.content }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}"
)


def builtin_settings() -> list[ModelSettings]:
    """Settings of every built-in model."""
    from ..torchserve.archive import archive_settings

    return [
        ModelSettings(
            name="identity",
            implementation="actorserve.models.identity.IdentityModel",
            # any datatype and shape (metadata shows FP32 [-1]); no declared parameters:
            # every parameter is echoed back
            inputs=(
                TensorSpec("INPUT0", ANY_DATATYPE, (-1,)),
                TensorSpec("INPUT1", ANY_DATATYPE, (-1,), optional=True),
            ),
            outputs=(TensorSpec("OUTPUT0", ANY_DATATYPE, (-1,)), TensorSpec("OUTPUT1", ANY_DATATYPE, (-1,))),
        ),
        ModelSettings(
            name="streamer",
            implementation="actorserve.models.streamer.StreamerModel",
            inputs=(TensorSpec("text_input", "BYTES", (1,), optional=True),),
            outputs=(TensorSpec("text_output", "BYTES", (1,)), TensorSpec("index", "INT64", (1,))),
        ),
        ModelSettings(
            name="accumulator",
            implementation="actorserve.models.accumulator.AccumulatorModel",
            sequence=SequenceSettings(idle_timeout_ms=600_000, max_sequences=100_000),
            inputs=(TensorSpec("INPUT", "INT64", (1,)),),
            outputs=(TensorSpec("OUTPUT", "INT64", (1,)),),
        ),
        ModelSettings(
            name="text",
            implementation="actorserve.models.text.TextModel",
            parameters={"prefill_chunk": 32, "max_tokens_limit": 2048},
            sequence=SequenceSettings(idle_timeout_ms=600_000, max_sequences=4096, evict_idle=True),
            inputs=(TensorSpec("text_input", "BYTES", (1,), optional=True),),
            outputs=(TensorSpec("text_output", "BYTES", (1,)),),
            text_generation={"chat_template": TEXT_CHAT_TEMPLATE, "chat_stop": ["\n\n"]},
        ),
        # TorchServe's stateful example, as a TorchServe model folder (MAR-INF/MANIFEST.json)
        archive_settings(Path(__file__).parent / "ts_stateful"),
    ]
