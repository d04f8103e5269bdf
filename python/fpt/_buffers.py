"""The memory of a tensor as libfpt takes it: an address, a byte count and
an element type, without copying. PyTorch CPU tensors give data_ptr();
NumPy arrays and any other buffer-protocol object (bytearray, memoryview)
go through a NumPy view of the same memory."""

FLOAT32, FLOAT64, FLOAT16, BFLOAT16 = 1, 2, 3, 4
DTYPE_NAMES = {FLOAT32: "float32", FLOAT64: "float64", FLOAT16: "float16", BFLOAT16: "bfloat16"}
_BY_NAME = {"float32": FLOAT32, "float64": FLOAT64, "float16": FLOAT16, "bfloat16": BFLOAT16,
            "torch.float32": FLOAT32, "torch.float64": FLOAT64, "torch.float16": FLOAT16,
            "torch.bfloat16": BFLOAT16}
# The wire types of a compressed float32 key (fpt.declare's compression).
WIRES = {None: 0, "none": 0, "bf16": BFLOAT16, "bfloat16": BFLOAT16, "fp16": FLOAT16, "float16": FLOAT16}
SUMMABLE = "float32, float64, float16, bfloat16"


def dtype_code(dtype):
    """An fpt dtype code from a code, a name ("float32"), a NumPy dtype or
    a torch dtype; None if it is none of fpt's."""
    if isinstance(dtype, int):
        return dtype if dtype in DTYPE_NAMES else None
    return _BY_NAME.get(str(dtype))


class View:
    """A buffer's address, size and fpt dtype (None: raw bytes, unchecked).
    obj is what must stay alive while the library uses the memory."""

    __slots__ = ("obj", "ptr", "nbytes", "dtype")

    def __init__(self, obj, ptr, nbytes, dtype):
        self.obj, self.ptr, self.nbytes, self.dtype = obj, ptr, nbytes, dtype


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def view(obj, writable, op):
    """The View of obj; ValueError/TypeError (raised by the caller as fpt
    errors) say why obj cannot be used: not contiguous, not on the CPU,
    read-only where the library writes, or not floating point."""
    if _is_torch(obj):
        if obj.device.type != "cpu":
            raise TypeError("%s: tensor is on %s; fpt takes CPU tensors (fpt.allreduce and fpt.torch copy "
                            "GPU tensors through pinned memory)" % (op, obj.device))
        if obj.is_sparse:
            raise TypeError("%s: tensor is sparse; fpt takes dense tensors" % op)
        if not obj.is_contiguous():
            raise ValueError("%s: tensor is not contiguous (call .contiguous() and pass that)" % op)
        code = dtype_code(obj.dtype)
        if code is None:
            raise TypeError("%s: tensor dtype %s is not one of fpt's (%s)" % (op, obj.dtype, SUMMABLE))
        return View(obj, obj.data_ptr(), obj.numel() * obj.element_size(), code)
    import numpy as np

    arr = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, dtype=_buffer_dtype(obj))
    if not arr.flags.c_contiguous:
        raise ValueError("%s: array is not C-contiguous (np.ascontiguousarray makes a copy to pass)" % op)
    if writable and not arr.flags.writeable:
        raise ValueError("%s: buffer is read-only, and the library writes into it" % op)
    if arr.dtype == np.uint8:
        code = None  # raw bytes: the declaration alone says what they hold
    else:
        code = dtype_code(arr.dtype.name)
        if code is None:
            raise TypeError("%s: array dtype %s is not one of fpt's (%s)" % (op, arr.dtype, SUMMABLE))
    return View(obj, arr.ctypes.data if arr.nbytes else 0, arr.nbytes, code)


def _buffer_dtype(obj):
    fmt = memoryview(obj).format.lstrip("@=<")
    return {"f": "float32", "d": "float64", "e": "float16"}.get(fmt, "uint8")
