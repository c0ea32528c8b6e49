"""The one exception hierarchy of rlx.

Every error a user can cause is an :class:`RlxError`. Messages name the tensor or node,
what was expected and what was given, and (where a node is involved) the line of user code
that built it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.source import SourceLoc

__all__ = [
    "RlxError",
    "ShapeError",
    "DTypeError",
    "VerifyError",
    "LowerError",
    "UnsupportedOpError",
    "CompileError",
    "InputError",
    "SerializationError",
    "QuantizationError",
    "StageError",
    "ConfigError",
    "ModelError",
    "TraceError",
    "GgufError",
    "AutodiffError",
    "DistributedError",
    "ServeError",
    "QuantizationWarning",
]


class RlxError(Exception):
    """Base class of every error rlx raises on bad user input."""

    def __init__(self, message: str, *, node: int | None = None, loc: SourceLoc | None = None):
        self.node = node
        self.loc = loc
        self.bare_message = message
        text = message
        if loc is not None and loc.file:
            text = f"{message}\n  node built at {loc}"
        super().__init__(text)


class ShapeError(RlxError, ValueError):
    """An op's shape or dtype rule rejected its inputs."""


class DTypeError(ShapeError):
    """A dtype that an op or conversion does not accept."""


class VerifyError(RlxError, ValueError):
    """The graph verifier found a malformed graph."""


class LowerError(RlxError, ValueError):
    """HIR could not be lowered to MIR."""


class StageError(RlxError, TypeError):
    """A GraphModule method was called at a stage that does not support it."""


class UnsupportedOpError(RlxError, NotImplementedError):
    """A backend does not support an op (raised at compile time, listing every such op)."""


class CompileError(RlxError, RuntimeError):
    """Compilation failed (pass failure, native build failure, bad options)."""


class InputError(RlxError, ValueError):
    """Bad input to a compiled graph: unknown or missing name, wrong shape/dtype, NaN."""


class SerializationError(RlxError, ValueError):
    """A saved graph file is truncated, corrupted or of an unknown version."""


class QuantizationError(RlxError, ValueError):
    """Calibration or quantization was given inconsistent data."""


class ConfigError(RlxError, ValueError):
    """An ``RLX_*`` environment variable (or a configuration value) that does not parse."""


class ModelError(RlxError, ValueError):
    """A model directory rlx cannot load: a missing or malformed file, an unsupported
    architecture, config value or precision, or a checkpoint tensor missing, extra or
    misshapen."""


class TraceError(RlxError, TypeError):
    """Python code traced by ``rlx.jit`` asked a traced value for something only a
    concrete value has (``bool(x)``, ``int(x)``, iterating it), or passed ``rlx.jit`` an
    argument it cannot trace."""


class GgufError(ModelError):
    """A GGUF file rlx cannot read or write: bad magic or version, a truncated header, a
    tensor whose type rlx does not map, whose data runs past the end of the file or
    overlaps another, or a value the format cannot hold."""


class AutodiffError(RlxError, ValueError):
    """A gradient, jvp or vmap that cannot be built: a non-float ``wrt``, a non-scalar loss
    without a cotangent, an op without a derivative or batching rule."""


class DistributedError(RlxError, RuntimeError):
    """Running rlx on Ray or a collective library failed: the ``distributed`` extra is not
    installed, an embedding output is incomplete or holds a row twice, or the ranks of a
    data-parallel run disagree."""


class ServeError(RlxError, RuntimeError):
    """The ``rlx serve`` HTTP server cannot start or refuses a request: the ``serve`` extra
    is not installed, a model given twice or of a kind it cannot serve, or (as
    :class:`rlx.serve.errors.ApiError`) a request that breaks a limit or the schema."""


class QuantizationWarning(RuntimeWarning):
    """Calibration or quantization went on, but the data deserves a look (e.g. NaN / Inf
    among a tensor's calibration values); the message names the tensor."""
