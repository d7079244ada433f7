"""What an op computes, from its recorded input shapes: FLOPs and bytes (``analysis.roofline`` divides
them by its kernels' time).

``estimate(name, dims, types, concrete)`` turns one op's ``Input Dims``, ``Input type``
and, where the trace has them, ``Concrete Inputs`` (stride, padding, causal flags …) into FLOPs and
bytes, in the conventions of model FLOPs (a multiply-add is 2 FLOPs; nothing recomputed counts):

- *matmul* (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``addbmm``, ``matmul``, ``linear``, ``mv``,
  ``addmv``, ``_addmm_activation``, ``_scaled_mm``): ``2·batch·M·K·N``, batch dims broadcast;
- *conv* (``conv1d/2d/3d``, ``convolution``, ``_convolution``, ``cudnn_``/``miopen_convolution``,
  the transposed ones and ``convolution_backward``): ``2·N·(output pixels)·(weight elements)``,
  the output size from stride, padding and dilation, so a forward convolution needs Concrete
  Inputs (PyTorch 2.x records them); the backward op's ``grad_output`` gives it without, and its
  ``output_mask`` (else both) says whether the input's and the weight's gradients are computed
  (one forward's FLOPs each); a transposed convolution's FLOPs follow from its input alone;
- *attention* (``scaled_dot_product_attention`` and its flash / efficient / cuDNN ops, forward
  and backward): ``2·batch·Lq·Lk·(E + Ev)``, halved (exactly: the pairs a top-left causal mask
  keeps) when ``is_causal`` is set; the backward is twice the forward (FlashAttention's recomputed
  ``QKᵀ`` is hardware work, not model FLOPs). Their inner ``_flash_attention_*`` /
  ``_efficient_attention_*`` ops are left to their callers (their layout differs);
- *elementwise* (add, mul, activations, their backward, copies, fills …): one FLOP per output
  element; these are memory-bound by nature and are reported by bandwidth.

Bytes are the least device-memory traffic: every tensor input read once and every output
written once, in its dtype (an estimate: caches make it less, a kernel that makes several passes
more).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

# dtype as Kineto writes it (``c10::`` stripped) -> (precision, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4), "double": ("fp64", 8), "half": ("fp16", 2), "bfloat16": ("bf16", 2),
    "float8_e4m3fn": ("fp8", 1), "float8_e5m2": ("fp8", 1), "float8_e4m3fnuz": ("fp8", 1),
    "float8_e5m2fnuz": ("fp8", 1), "float8_e8m0fnu": ("fp8", 1),
    "int": ("other", 4), "long": ("other", 8), "long int": ("other", 8), "short": ("other", 2),
    "short int": ("other", 2), "signed char": ("other", 1), "unsigned char": ("other", 1),
    "bool": ("other", 1), "complex<float>": ("other", 8), "complex<double>": ("other", 16),
    "complex<c10::half>": ("other", 4),
}


_MATMUL = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul", "aten::linear",
    "aten::mv", "aten::addmv", "aten::_addmm_activation", "aten::_scaled_mm",
})


_CONV_STRIDE_FIRST = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution"})


_CONV_PADDING_FIRST = frozenset({"aten::cudnn_convolution", "aten::miopen_convolution",
                                 "aten::miopen_depthwise_convolution"})


_CONV_TRANSPOSE = frozenset({"aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d",
                             "aten::cudnn_convolution_transpose", "aten::miopen_convolution_transpose"})


_CONV_BACKWARD = "aten::convolution_backward"


# name -> (index of q, index of is_causal, backward)
_ATTENTION: dict[str, tuple[int, int, bool]] = {
    "aten::scaled_dot_product_attention": (0, 5, False),
    "aten::_scaled_dot_product_flash_attention": (0, 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 6, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 14, True),
}


_POINTWISE = re.compile(
    r"^aten::(add|sub|rsub|mul|div|true_divide|neg|abs|exp|exp2|expm1|log|log2|log10|log1p|sqrt|rsqrt|pow|"
    r"reciprocal|sigmoid|tanh|relu|relu6|gelu|silu|mish|hardswish|hardsigmoid|hardtanh|leaky_relu|elu|selu|celu|"
    r"softplus|threshold|clamp|clamp_min|clamp_max|clip|where|masked_fill|lerp|addcmul|addcdiv|maximum|minimum|"
    r"fmax|fmin|fill|zero|copy|_to_copy|sign|sgn|sin|cos|erf|erfc|floor|ceil|round|trunc|fmod|remainder|eq|ne|"
    r"lt|le|gt|ge|logical_not|logical_and|logical_or|bitwise_and|bitwise_or|bitwise_not|nan_to_num|"
    r"native_dropout|native_dropout_backward|threshold_backward|gelu_backward|silu_backward|sigmoid_backward|"
    r"tanh_backward|hardswish_backward|hardtanh_backward|leaky_relu_backward|elu_backward|softplus_backward|"
    r"mish_backward)_?$"
)


_WRITE_ONLY = re.compile(r"^aten::(fill|zero)_$")


def op_class(name: str) -> str | None:
    """"matmul", "conv", "attention" or "elementwise" for the ops the roofline models, else None."""
    if name in _MATMUL:
        return "matmul"
    if name in _CONV_STRIDE_FIRST or name in _CONV_PADDING_FIRST or name in _CONV_TRANSPOSE or name == _CONV_BACKWARD:
        return "conv"
    if name in _ATTENTION:
        return "attention"
    if _POINTWISE.match(name):
        return "elementwise"
    return None


@dataclass(frozen=True, slots=True)
class OpWork:
    """What one op instance computed and moved, by its input shapes."""

    op_class: str  # "matmul", "conv", "attention", "elementwise"
    flops: int
    bytes: int
    dtype: str  # "fp32", "bf16", "fp16", "fp8", "fp64", "other"


def _dtype(text: object) -> tuple[str, int] | None:
    if not isinstance(text, str) or not text:
        return None
    t = text.strip().lower()
    if t.startswith("c10::"):
        t = t[5:]
    return _DTYPES.get(t)


def _shape(dims: list, i: int) -> tuple[int, ...] | None:
    if i >= len(dims):
        return None
    d = dims[i]
    if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
        return None
    return tuple(d)


def _tensor(dims: list, types: list, i: int) -> tuple[tuple[int, ...], str, int] | None:
    """(shape, precision, element size) of argument ``i`` when it is a tensor."""
    shape = _shape(dims, i)
    dt = _dtype(types[i]) if i < len(types) else None
    if shape is None or dt is None:
        return None
    return shape, dt[0], dt[1]


def _concrete(concrete: list, i: int) -> str:
    if i >= len(concrete) or not isinstance(concrete[i], str):
        return ""
    return concrete[i].strip().strip("'\"")


def _int_list(text: str) -> list[int] | None:
    t = text.strip()
    if not t:
        return None
    if not t.startswith("["):
        try:
            return [int(t)]
        except ValueError:
            return None
    try:
        return [int(x) for x in t.strip("[]").split(",") if x.strip()]
    except ValueError:
        return None


def _bool_list(text: str) -> list[bool] | None:
    t = text.strip()
    if not t.startswith("["):
        return None
    items = [x.strip() for x in t.strip("[]").split(",") if x.strip()]
    if not items or any(x not in ("True", "False", "true", "false", "1", "0") for x in items):
        return None
    return [x in ("True", "true", "1") for x in items]


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _per_dim(values: list[int] | None, n: int) -> list[int] | None:
    """A per-dimension list (one value stands for every dimension); None when it does not fit."""
    if values is None:
        return None
    if len(values) == 1:
        return values * n
    return values if len(values) == n else None


def _matmul(name: str, dims: list, types: list) -> OpWork | None:
    if name in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm", "aten::addbmm", "aten::addmv"):
        a_i, b_i, bias_i = 1, 2, 0
    elif name == "aten::linear":
        return _linear(dims, types)
    else:
        a_i, b_i, bias_i = 0, 1, None
    a, b = _tensor(dims, types, a_i), _tensor(dims, types, b_i)
    if a is None or b is None:
        return None
    (sa, dta, za), (sb, _, zb) = a, b
    if name in ("aten::mv", "aten::addmv"):
        if len(sa) != 2 or len(sb) != 1 or sa[1] != sb[0]:
            return None
        m, k, n, batch = sa[0], sa[1], 1, 1
    else:
        if not sa or not sb:
            return None
        ma = (1, *sa) if len(sa) == 1 else sa
        mb = (*sb, 1) if len(sb) == 1 else sb
        m, k = ma[-2], ma[-1]
        k2, n = mb[-2], mb[-1]
        if k != k2:
            return None
        if name in ("aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::_scaled_mm") and (len(sa) != 2 or len(sb) != 2):
            return None
        try:
            batch_shape = np.broadcast_shapes(tuple(ma[:-2]), tuple(mb[:-2]))
        except ValueError:
            return None
        batch = math.prod(batch_shape)
        if name == "aten::addbmm":  # sums the batch into one M×N output
            out = m * n
            flops = 2 * batch * m * k * n
            extra = _extra_bytes(dims, types, bias_i)
            return OpWork("matmul", flops, _numel(sa) * za + _numel(sb) * zb + out * za + extra, dta)
    flops = 2 * batch * m * k * n
    extra = _extra_bytes(dims, types, bias_i)
    return OpWork("matmul", flops, _numel(sa) * za + _numel(sb) * zb + batch * m * n * za + extra, dta)


def _extra_bytes(dims: list, types: list, i: int | None) -> int:
    if i is None:
        return 0
    t = _tensor(dims, types, i)
    return _numel(t[0]) * t[2] if t is not None else 0


def _linear(dims: list, types: list) -> OpWork | None:
    x, w = _tensor(dims, types, 0), _tensor(dims, types, 1)
    if x is None or w is None or not x[0] or len(w[0]) != 2 or x[0][-1] != w[0][1]:
        return None
    (sx, dt, z), (sw, _, zw) = x, w
    rows = _numel(sx[:-1])
    k, n = sw[1], sw[0]
    return OpWork("matmul", 2 * rows * k * n,
                  _numel(sx) * z + _numel(sw) * zw + rows * n * z + _extra_bytes(dims, types, 2), dt)


def _split_conv_input(si: tuple[int, ...], sw: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
    """(batch, spatial dims) of a convolution input, batched or not, for a weight of rank 2 + d."""
    d = len(sw) - 2
    if d < 1 or d > 3:
        return None
    if len(si) == d + 2:
        return si[0], si[2:]
    if len(si) == d + 1:  # unbatched
        return 1, si[1:]
    return None


def _conv_forward(name: str, dims: list, types: list, concrete: list) -> OpWork | None:
    i, w = _tensor(dims, types, 0), _tensor(dims, types, 1)
    if i is None or w is None:
        return None
    (si, dt, z), (sw, _, zw) = i, w
    split = _split_conv_input(si, sw)
    if split is None:
        return None
    n, spatial = split
    d = len(spatial)
    transposed = name in _CONV_TRANSPOSE or (
        name in ("aten::convolution", "aten::_convolution") and _concrete(concrete, 6) == "True")
    bias = _extra_bytes(dims, types, 2) if name not in ("aten::cudnn_convolution", "aten::cudnn_convolution_transpose") else 0
    if transposed:  # each input pixel meets every weight element of its group
        flops = 2 * n * _numel(spatial) * _numel(sw)
        out_channels = sw[1] * _groups(name, concrete)
        stride = _per_dim(_int_list(_concrete(concrete, 3)), d) if name in _CONV_STRIDE_FIRST or name.startswith(
            "aten::conv_transpose") else None
        out_pixels = _numel(tuple(s * (stride[j] if stride else 1) for j, s in enumerate(spatial)))
        return OpWork("conv", flops, _numel(si) * z + _numel(sw) * zw + n * out_channels * out_pixels * z + bias, dt)
    if name in _CONV_STRIDE_FIRST:
        stride_t, padding_t, dilation_t = _concrete(concrete, 3), _concrete(concrete, 4), _concrete(concrete, 5)
    else:  # padding first (cudnn/miopen): the first int list after the weight
        first = next((j for j in range(2, len(concrete)) if _concrete(concrete, j).startswith("[")), None)
        if first is None:
            return None
        padding_t, stride_t, dilation_t = (_concrete(concrete, first), _concrete(concrete, first + 1),
                                           _concrete(concrete, first + 2))
    kernel = sw[2:]
    stride = _per_dim(_int_list(stride_t), d)
    dilation = _per_dim(_int_list(dilation_t), d) or [1] * d
    if stride is None:
        return None
    if padding_t.lower() == "same":
        out = [math.ceil(s / stride[j]) for j, s in enumerate(spatial)]
    else:
        padding = [0] * d if padding_t.lower() == "valid" else _per_dim(_int_list(padding_t), d)
        if padding is None:
            return None
        out = [(s + 2 * padding[j] - dilation[j] * (kernel[j] - 1) - 1) // stride[j] + 1 for j, s in enumerate(spatial)]
    if any(o <= 0 for o in out):
        return None
    out_pixels = math.prod(out)
    flops = 2 * n * out_pixels * _numel(sw)
    return OpWork("conv", flops, _numel(si) * z + _numel(sw) * zw + n * sw[0] * out_pixels * z + bias, dt)


def _groups(name: str, concrete: list) -> int:
    idx = {"aten::convolution": 8, "aten::_convolution": 8, "aten::conv_transpose1d": 6, "aten::conv_transpose2d": 6,
           "aten::conv_transpose3d": 6}.get(name)
    if idx is None:
        return 1
    g = _int_list(_concrete(concrete, idx))
    return g[0] if g and len(g) == 1 and g[0] > 0 else 1


def _conv_backward(dims: list, types: list, concrete: list) -> OpWork | None:
    go, i, w = _tensor(dims, types, 0), _tensor(dims, types, 1), _tensor(dims, types, 2)
    if go is None or i is None or w is None:
        return None
    (sgo, dt, z), (si, _, zi), (sw, _, zw) = go, i, w
    transposed = _concrete(concrete, 7) == "True"
    side = _split_conv_input(si if transposed else sgo, sw)
    if side is None:
        return None
    n, spatial = side
    forward = 2 * n * _numel(spatial) * _numel(sw)
    mask = _bool_list(_concrete(concrete, 10)) or [True, True, True]
    mask = (mask + [True, True, True])[:3]
    flops = forward * (int(mask[0]) + int(mask[1]))
    if flops <= 0:
        return None
    nbytes = (_numel(sgo) * z + _numel(si) * zi + _numel(sw) * zw
              + (_numel(si) * zi if mask[0] else 0) + (_numel(sw) * zw if mask[1] else 0))
    return OpWork("conv", flops, nbytes, dt)


def causal_pairs(lq: int, lk: int) -> int:
    """Query-key pairs a top-left causal mask keeps (``is_causal`` in PyTorch's SDPA): query ``i``
    sees keys ``0..i``."""
    if lq <= lk:
        return lq * (lq + 1) // 2
    return lk * (lk + 1) // 2 + (lq - lk) * lk


def _attention(name: str, dims: list, types: list, concrete: list) -> OpWork | None:
    qi, ci, backward = _ATTENTION[name]
    q, k, v = _tensor(dims, types, qi), _tensor(dims, types, qi + 1), _tensor(dims, types, qi + 2)
    if q is None or k is None or v is None:
        return None
    (sq, dt, z), (sk, _, zk), (sv, _, zv) = q, k, v
    if len(sq) < 2 or len(sk) < 2 or len(sv) < 2 or sq[-1] != sk[-1] or sk[-2] != sv[-2]:
        return None
    batch = _numel(sq[:-2])
    lq, lk, e, ev = sq[-2], sk[-2], sq[-1], sv[-1]
    pairs = causal_pairs(lq, lk) if _concrete(concrete, ci) == "True" else lq * lk
    forward = 2 * batch * pairs * (e + ev)
    out = batch * lq * ev * z
    qkv = _numel(sq) * z + _numel(sk) * zk + _numel(sv) * zv
    if backward:  # reads grad_out, q, k, v, out; writes dq, dk, dv
        return OpWork("attention", 2 * forward, 2 * out + 2 * qkv, dt)
    return OpWork("attention", forward, qkv + out, dt)


def _elementwise(name: str, dims: list, types: list) -> OpWork | None:
    tensors = [t for j in range(len(dims)) if (t := _tensor(dims, types, j)) is not None]
    if not tensors:
        return None
    try:
        out_shape = tuple(np.broadcast_shapes(*(t[0] for t in tensors)))
    except ValueError:
        out_shape = max((t[0] for t in tensors), key=_numel)
    out = _numel(out_shape)
    reads = sum(_numel(t[0]) * t[2] for t in tensors)
    if _WRITE_ONLY.match(name):
        reads = 0
    elif name == "aten::copy_":  # the destination is written, not read
        reads -= _numel(tensors[0][0]) * tensors[0][2]
    return OpWork("elementwise", out, max(0, reads) + out * tensors[0][2], tensors[0][1])


def estimate(name: str, dims: list, types: list, concrete: list | None = None) -> OpWork | None:
    """The FLOPs and bytes of one op from its recorded inputs (None: not a modelled op, or its
    shapes do not say: a forward convolution without Concrete Inputs, mismatched shapes …)."""
    concrete = concrete or []
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    try:
        if name in _MATMUL:
            return _matmul(name, dims, types)
        if name == _CONV_BACKWARD:
            return _conv_backward(dims, types, concrete)
        if name in _CONV_STRIDE_FIRST or name in _CONV_PADDING_FIRST or name in _CONV_TRANSPOSE:
            return _conv_forward(name, dims, types, concrete)
        if name in _ATTENTION:
            return _attention(name, dims, types, concrete)
        if _POINTWISE.match(name):
            return _elementwise(name, dims, types)
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    return None
