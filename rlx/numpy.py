"""``rlx.numpy``: NumPy-shaped functions over values traced by ``rlx.jit``.

The functions live in :mod:`rlx.frontends.trace.numpy_math` (elementwise math,
reductions, products) and :mod:`rlx.frontends.trace.numpy_shape` (shapes, joins,
indexing helpers, constructors); this module is their public face. ``ndarray`` is the
traced value's class.
"""

from __future__ import annotations

import numpy as _np

from rlx.frontends.trace.numpy_math import *  # noqa: F403
from rlx.frontends.trace.numpy_math import __all__ as _math_all
from rlx.frontends.trace.numpy_shape import *  # noqa: F403
from rlx.frontends.trace.numpy_shape import __all__ as _shape_all
from rlx.frontends.trace.values import Traced as ndarray

newaxis = None
pi = _np.pi
e = _np.e
inf = _np.inf
nan = _np.nan
float32 = _np.float32
float64 = _np.float64
float16 = _np.float16
int32 = _np.int32
int64 = _np.int64
int8 = _np.int8
uint8 = _np.uint8
bool_ = _np.bool_

__all__ = [*_math_all, *_shape_all, "ndarray", "newaxis", "pi", "e", "inf", "nan",
           "float32", "float64", "float16", "int32", "int64", "int8", "uint8", "bool_"]  # fmt: skip
